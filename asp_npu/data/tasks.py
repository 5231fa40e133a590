"""Verifiable synthetic tasks whose correct answers have controllable, long-tailed lengths.

Why: the scheduler is about response-length heterogeneity, and a small model trained from scratch
cannot do real reasoning. These tasks make the *correct* answer's length a known function of the
prompt (count from a to b -> b-a+1 numbers), so the length distribution of a dataset is whatever
`LengthDist` says (long-tailed, bimodal, uniform, ...), the same prompt always asks for the same
length (history-based predictors can learn it), and every answer is checked exactly.

Tasks (`TASKS`):
- `count`   "Count from 17 to 25."          -> "17 18 19 20 21 22 23 24 25"
- `rle`     "Expand: a3 b1 c4"              -> "aaabcccc"
- `addsteps` "Add 4821+937 step by step."   -> one line per digit column, then the sum
Each answer is a list of *items* (numbers, characters, steps); the length knob is the item count.

A task that needs a tool (`TOOL_TASKS`, multi-turn rollouts: asp_npu/rollout/multi_turn.py):
- `calc`    "Compute 48213*9137."           -> the model calls `calculator` with "48213*9137" and
  answers "440522181" after the tool's turn. The item count is the first operand's digits; a tiny model
  cannot multiply long numbers, but it can copy them into a call and copy the result back. The reward
  reads only what the model wrote after its last call (`calc_answer`), never the tool's output.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asp_npu.errors import UserError
from asp_npu.types import PromptItem
from asp_npu.validation import SEED_MAX, check_float, check_int

DIST_KINDS = ("lognormal", "pareto", "uniform", "bimodal", "fixed")


MAX_ITEMS = 1_000_000  # answer items per prompt: far beyond any model's max_tokens


@dataclass(frozen=True)
class LengthDist:
    """Distribution of the number of answer items per prompt, clipped to [min_items, max_items].

    lognormal: median, sigma. pareto: median (= scale), alpha. uniform: min..max.
    bimodal: a `frac_long` share of prompts with median `median_long`, the rest `median`, both
    lognormal with `sigma`. fixed: always `median`.
    """

    kind: str = "lognormal"
    median: float = 8.0
    sigma: float = 1.0
    alpha: float = 1.5
    median_long: float = 64.0
    frac_long: float = 0.1
    min_items: int = 1
    max_items: int = 256

    def __post_init__(self) -> None:
        if self.kind not in DIST_KINDS:
            raise UserError(f"length distribution '{self.kind}' is not one of {', '.join(DIST_KINDS)}")
        check_int("length distribution min_items", self.min_items, 1, MAX_ITEMS)
        check_int("length distribution max_items", self.max_items, 1, MAX_ITEMS)
        if self.min_items > self.max_items:
            raise UserError(
                f"length distribution: need 1 <= min_items <= max_items (got {self.min_items}, "
                f"{self.max_items})"
            )
        # finite: a NaN median used to pass `<= 0` and fail later in math.floor, mid-run
        check_float("length distribution median", self.median, 0.0, MAX_ITEMS, lo_open=True)
        check_float("length distribution median_long", self.median_long, 0.0, MAX_ITEMS, lo_open=True)
        check_float("length distribution sigma", self.sigma, 0.0, 10.0)
        check_float("length distribution alpha", self.alpha, 0.0, 100.0, lo_open=True)
        check_float("length distribution frac_long", self.frac_long, 0.0, 1.0)

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            x = self.median
        elif self.kind == "uniform":
            x = rng.uniform(self.min_items, self.max_items + 1)
        elif self.kind == "pareto":
            x = self.median * rng.paretovariate(self.alpha) / 2 ** (1 / self.alpha)
        else:
            median = self.median
            if self.kind == "bimodal" and rng.random() < self.frac_long:
                median = self.median_long
            x = median * math.exp(rng.gauss(0.0, self.sigma))
        return int(min(self.max_items, max(self.min_items, math.floor(x))))


def parse_length_dist(spec: str) -> LengthDist:
    """`"lognormal:median=8,sigma=1.2,max_items=200"` -> LengthDist (for CLIs and configs)."""
    kind, _, rest = spec.partition(":")
    kwargs: dict[str, float | int | str] = {"kind": kind.strip()}
    fields = {f for f in LengthDist.__dataclass_fields__ if f != "kind"}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        key = {"max": "max_items", "min": "min_items"}.get(key.strip(), key.strip())
        if not eq or key not in fields:
            raise UserError(
                f"length distribution '{spec}': bad entry '{part}' (known: {', '.join(sorted(fields))})"
            )
        try:
            kwargs[key] = int(value) if key in ("min_items", "max_items") else float(value)
        except ValueError:
            raise UserError(f"length distribution '{spec}': '{value}' is not a number") from None
    return LengthDist(**kwargs)  # type: ignore[arg-type]


@dataclass(frozen=True)
class TaskExample:
    prompt: str
    answer: str
    items: int


def _count(rng: random.Random, n: int) -> TaskExample:
    start = rng.randint(0, 999)
    if rng.random() < 0.25 and start - n + 1 >= 0:
        nums = list(range(start, start - n, -1))
    else:
        nums = list(range(start, start + n))
    return TaskExample(f"Count from {nums[0]} to {nums[-1]}.", " ".join(map(str, nums)), n)


_RLE_CHARS = "abcdefghijklmnopqrstuvwxyz"


def _rle(rng: random.Random, n: int) -> TaskExample:
    runs: list[tuple[str, int]] = []
    left = n
    while left > 0:
        k = min(left, rng.randint(1, 9))
        prev = runs[-1][0] if runs else ""
        c = rng.choice([ch for ch in _RLE_CHARS if ch != prev])
        runs.append((c, k))
        left -= k
    code = " ".join(f"{c}{k}" for c, k in runs)
    return TaskExample(f"Expand: {code}", "".join(c * k for c, k in runs), n)


def _addsteps(rng: random.Random, n: int) -> TaskExample:
    digits_a = n
    digits_b = rng.randint(1, n)
    a = rng.randint(10 ** (digits_a - 1), 10**digits_a - 1) if digits_a > 1 else rng.randint(0, 9)
    b = rng.randint(10 ** (digits_b - 1), 10**digits_b - 1) if digits_b > 1 else rng.randint(0, 9)
    da, db = str(a)[::-1], str(b)[::-1]
    steps, carry = [], 0
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        steps.append(f"{x}+{y}+{carry}={s}")
        carry = s // 10
    steps.append(f"sum {a + b}")
    return TaskExample(f"Add {a}+{b} step by step.", "\n".join(steps), n)


def _calc(rng: random.Random, n: int) -> TaskExample:
    n = min(n, 12)
    a = rng.randint(10 ** (n - 1), 10**n - 1) if n > 1 else rng.randint(2, 9)
    m = rng.randint(1, n)
    b = rng.randint(10 ** (m - 1), 10**m - 1) if m > 1 else rng.randint(2, 9)
    return TaskExample(f"Compute {a}*{b}.", str(a * b), n)


GENERATORS: dict[str, Callable[[random.Random, int], TaskExample]] = {
    "count": _count,
    "rle": _rle,
    "addsteps": _addsteps,
    "calc": _calc,
}
TASKS = ("count", "rle", "addsteps")  # single-turn (`mix`, the tokenizer's corpus)
TOOL_TASKS = ("calc",)  # answered through a tool in a multi-turn rollout
ALL_TASKS = TASKS + TOOL_TASKS
DEFAULT_MAX_ITEMS = {"count": 256, "rle": 512, "addsteps": 64, "calc": 12}


def calc_answer(response: str) -> str:
    """What the model answered after its last tool call (the calc task's reward reads only this)."""
    return response.rsplit("</tool_call>", 1)[-1].strip()


def calc_call(prompt: str) -> str:
    """The tool call that answers a calc prompt ("Compute A*B." -> calculator("A*B"))."""
    from asp_npu.data.tool_format import render_tool_call

    return render_tool_call("calculator", {"expression": prompt.removeprefix("Compute ").rstrip(".")})


def tool_transcript(item: PromptItem, tokenizer: Any) -> tuple[list[int], list[int]]:
    """A calc prompt's whole multi-turn response as token ids, tokenized turn by turn exactly as the
    rollout builds it (the call + EOS, the chat template's tool turn, the answer + EOS: the SFT target),
    and its loss mask as the rollout records it (0 on the tool turn: the model never predicts a tool's
    output, so neither SFT nor RL trains on it)."""
    from asp_npu.data.tool_format import tool_turn_text

    eos = tokenizer.eos_token_id
    enc = lambda text: list(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    call = enc(calc_call(item.text or "")) + [eos]
    tool = enc(tool_turn_text(tokenizer, [str(item.ground_truth)]))
    answer = enc(str(item.ground_truth)) + [eos]
    return call + tool + answer, [1] * len(call) + [0] * len(tool) + [1] * len(answer)


def answer_items(task: str, answer: str) -> list[str]:
    """Split an answer into the items partial credit is counted over."""
    if task == "count":
        return answer.split()
    if task == "rle":
        return list(answer.strip())
    if task == "addsteps":
        return [line.strip() for line in answer.strip().splitlines() if line.strip()]
    if task == "calc":
        return list(calc_answer(answer))
    raise UserError(f"unknown task '{task}' (known: {', '.join(ALL_TASKS)})")


def make_example(task: str, rng: random.Random, items: int) -> TaskExample:
    if task not in GENERATORS:
        raise UserError(f"unknown task '{task}' (known: {', '.join(ALL_TASKS)})")
    return GENERATORS[task](rng, max(1, items))


def make_prompts(task: str, num: int, seed: int = 0, dist: LengthDist | None = None) -> list[PromptItem]:
    """`num` prompts of one task (or `mix` = round-robin over all); deterministic in `seed`.

    `prompt_id` is stable for a given (task, seed, index), so prompts repeat across epochs with the
    same id and the same answer length.
    """
    check_int("number of prompts", num, 0, 10_000_000)
    check_int("seed", seed, 0, SEED_MAX)
    names = list(TASKS) if task == "mix" else [task]
    for name in names:
        if name not in GENERATORS:
            raise UserError(f"unknown task '{name}' (known: {', '.join(ALL_TASKS)}, mix)")
    rng = random.Random(seed)
    items_out: list[PromptItem] = []
    for i in range(num):
        name = names[i % len(names)]
        d = dist or LengthDist(max_items=DEFAULT_MAX_ITEMS[name])
        ex = make_example(name, rng, d.sample(rng))
        items_out.append(
            PromptItem(
                prompt_id=f"{name}-{seed}-{i}",
                text=ex.prompt,
                ground_truth=ex.answer,
                meta={"data_source": f"asp/{name}", "task": name, "answer_items": ex.items},
            )
        )
    return items_out


def corpus_lines(num: int = 3000, seed: int = 0) -> list[str]:
    """Text covering every task's prompts and answers (the tokenizer is trained on it)."""
    rng = random.Random(seed)
    lines: list[str] = []
    for i in range(num):
        name = TASKS[i % len(TASKS)]
        ex = make_example(name, rng, LengthDist(max_items=24).sample(rng))
        lines += [ex.prompt, *ex.answer.splitlines()]
    return lines
