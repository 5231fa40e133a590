"""Rule-based rewards: the registry of verifiers, their weighted sum, and the default rule by data_source.

Why rule-based: GRPO on verifiable tasks needs no reward model, and the reward must be the same
function in tests, the simulator's traces and real training.

The reward of a sample is `sum(w_i * verifier_i(response, ground_truth))` over `reward.verifier_function`
with `reward.verifier_weight` (MindSpeed-RL's `rl_config.verifier_function` / `verifier_weight`). The
names are MindSpeed-RL's verifiers and verl's rule scores (`asp_npu.data.verifiers`), `custom` (the
user's `reward.custom_function`, verl's `custom_reward_function`) and `auto`, the default: the rule the
row's `data_source` selects -- `asp/<task>` -> the synthetic task's reward (exact match or partial
credit), a verl data source (`openai/gsm8k`, MATH, `math_dapo`, `aime*`) -> verl's rule for it, anything
else -> asp-npu's lenient math reward (final `\\boxed{}` answer, else the last number; GSM8K ground
truths `... #### 72` are understood). `RewardScorer` runs every verifier call in a `VerifierPool`
(timeout per call; a hung or failing verifier scores 0 and is counted).
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asp_npu.data.reward_pool import OK, VerifierPool
from asp_npu.data.tasks import ALL_TASKS, answer_items, calc_answer
from asp_npu.data.verifiers import MINDSPEED_VERIFIERS, VERL_SCORES, brace_end, verl_rule_for

RewardFn = Callable[[str, Any], float]


def _norm_ws(text: str) -> str:
    return " ".join(text.split())


def task_reward(task: str, response: str, ground_truth: str, partial: bool = True) -> float:
    """1.0 for the exact answer; with `partial`, the share of answer items right in position.

    Partial credit divides by max(expected, produced) items, so padding an answer with extra
    items or stopping early both cost reward.
    """
    if task == "calc":  # the answer after the model's last tool call; the call and tool output never count
        response = calc_answer(response)
    if task == "addsteps":
        got_items = answer_items(task, response)
        exp_items = answer_items(task, ground_truth)
        if got_items == exp_items:
            return 1.0
    elif _norm_ws(response) == _norm_ws(ground_truth):
        return 1.0
    else:
        got_items = answer_items(task, response if task != "rle" else "".join(response.split()))
        exp_items = answer_items(task, ground_truth)
    if not partial:
        return 0.0
    denom = max(len(exp_items), len(got_items))
    if denom == 0:
        return 0.0
    hits = sum(1 for g, e in zip(got_items, exp_items, strict=False) if g == e)
    return hits / denom


_NUM_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced; None if absent."""
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    brace = text.find("{", idx)
    if brace < 0:
        rest = text[idx + len("\\boxed") :].strip().split()
        return rest[0] if rest else None
    end = brace_end(text, brace)
    return None if end is None else text[brace + 1 : end]


def last_number(text: str) -> str | None:
    found = _NUM_RE.findall(text)
    return found[-1] if found else None


def extract_answer(text: str) -> str | None:
    """The final answer of a solution: boxed content, else what follows `####`, else the last number."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    return last_number(text)


def _to_float(s: str) -> float | None:
    s = s.strip().strip("$").replace(",", "").replace("\\!", "").rstrip(".")
    s = re.sub(r"^\\text\{(.*)\}$", r"\1", s).strip()
    frac = re.fullmatch(r"\\d?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}", s)
    try:
        if frac:
            return float(frac.group(1)) / float(frac.group(2))
        if re.fullmatch(r"-?\d+/\d+", s):
            num, den = s.split("/")
            return float(num) / float(den)
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def _norm_answer(s: str) -> str:
    s = s.strip().strip("$").replace(" ", "").replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\\text\{(.*?)\}", r"\1", s)
    return s.rstrip(".").lower()


def math_reward(response: str, ground_truth: Any) -> float:
    """1.0 when the response's final answer equals the ground truth (numerically when both parse)."""
    got = extract_answer(response)
    if got is None:
        return 0.0
    truth = str(ground_truth[0] if isinstance(ground_truth, list) and ground_truth else ground_truth)
    expected = extract_answer(truth) if ("####" in truth or "\\boxed" in truth) else truth
    if expected is None:
        return 0.0
    a, b = _to_float(got), _to_float(expected)
    if a is not None and b is not None:
        return 1.0 if abs(a - b) <= 1e-6 * max(1.0, abs(b)) else 0.0
    return 1.0 if _norm_answer(got) == _norm_answer(expected) else 0.0


def reward_fn_for(data_source: str, partial: bool = True) -> RewardFn:
    """The `auto` rule for a row's `data_source` (see the module docstring)."""
    if data_source.startswith("asp/") and data_source[4:] in ALL_TASKS:
        task = data_source[4:]
        return lambda response, truth: task_reward(task, response, str(truth), partial=partial)
    verl_rule = verl_rule_for(data_source)
    if verl_rule is not None:
        return VERL_SCORES[verl_rule]
    return math_reward


def compute_reward(data_source: str, response: str, ground_truth: Any, partial: bool = True) -> float:
    """The `auto` rule's reward, in this process (no pool: for evaluation and tests)."""
    return float(reward_fn_for(data_source, partial)(response, ground_truth))


# ------------------------------------------------------------------ the registry and the weighted sum
AUTO, CUSTOM = "auto", "custom"
VERIFIERS: dict[str, RewardFn] = {**MINDSPEED_VERIFIERS, **VERL_SCORES}
VERIFIER_NAMES = (AUTO, CUSTOM, *VERIFIERS)


def verifier_names(verifier_function: Any, custom_function: str) -> list[str]:
    """The verifiers a reward sums: `reward.verifier_function`, else `custom` or `auto`."""
    return list(verifier_function) or [CUSTOM if custom_function else AUTO]


@dataclass(frozen=True)
class RewardSpec:
    """How a rollout instance scores a sample (built from the config's `reward` section)."""

    verifier_function: tuple[str, ...] = ()  # () = (auto,), or (custom,) when custom_function is set
    verifier_weight: tuple[float, ...] = ()  # () = 1.0 each
    custom_function: str = ""  # "path/to/file.py:fn"
    timeout_s: float = 10.0
    num_workers: int = 2
    partial: bool = True  # synthetic tasks: partial credit

    def terms(self) -> list[tuple[str, float]]:
        """(verifier name, weight) pairs of the sum."""
        names = verifier_names(self.verifier_function, self.custom_function)
        weights = self.verifier_weight or (1.0,) * len(names)
        return list(zip(names, (float(w) for w in weights), strict=True))


def reward_spec(reward: Any) -> RewardSpec:
    """The config's `reward` section (`asp_npu.config.RewardConfig`) as a RewardSpec."""
    return RewardSpec(tuple(reward.verifier_function), tuple(float(w) for w in reward.verifier_weight),
                      reward.custom_function, float(reward.verifier_timeout), int(reward.verifier_parallel))


def split_custom(spec: str) -> tuple[str, str]:
    """`path/to/file.py:fn` -> (path, fn); the function name defaults to verl's `compute_score`."""
    path, sep, name = spec.rpartition(":")
    if not sep or "/" in name or "\\" in name or name.endswith(".py"):
        return spec, "compute_score"
    return path, name


def _custom_defines(path: Path, name: str) -> bool:
    """Whether the file defines `name` at top level (read with `ast`: the user's code is not run here)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found = {node.name}
        elif isinstance(node, ast.Assign):
            found = {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            found = {a.asname or a.name for a in node.names}
        else:
            continue
        if name in found:
            return True
    return False


def custom_problems(spec: str) -> list[str]:
    """`reward.custom_function` problems: a missing or unreadable file, a name the file does not define."""
    path_text, name = split_custom(spec)
    path = Path(path_text)
    if not path.is_file():
        return [f"reward.custom_function: '{path_text}' is not a file"]
    try:
        defined = _custom_defines(path, name)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
        return [f"reward.custom_function: cannot read {path_text} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''})"]
    return [] if defined else [f"reward.custom_function: {path_text} defines no '{name}'"]


def reward_problems(reward: Any) -> list[str]:
    """Every problem of the config's `reward` section (for `config.validate`)."""
    out: list[str] = []
    names, weights = list(reward.verifier_function), list(reward.verifier_weight)
    for name in names:
        if name not in VERIFIER_NAMES:
            out.append(f"reward.verifier_function: unknown verifier '{name}' "
                       f"(known: {', '.join(VERIFIER_NAMES)})")
    if weights and len(weights) != len(names or [AUTO]):
        out.append(f"reward.verifier_weight: {len(weights)} weight(s) for {len(names or [AUTO])} "
                   f"verifier(s) in reward.verifier_function {names}")
    if any(not math.isfinite(float(w)) for w in weights):
        out.append(f"reward.verifier_weight: weights must be finite numbers (got {weights})")
    if reward.custom_function:
        out += custom_problems(reward.custom_function)
        if names and CUSTOM not in names:
            out.append("reward.custom_function: set, but reward.verifier_function does not name 'custom'")
    elif CUSTOM in names:
        out.append("reward.verifier_function: 'custom' needs reward.custom_function (path/to/file.py:fn)")
    return out


_CUSTOM_CACHE: dict[tuple[str, str], Callable[..., Any]] = {}


def _load_custom(spec: str) -> Callable[..., Any]:
    """The user's function, imported once per worker process."""
    path, name = split_custom(spec)
    key = (str(Path(path).resolve()), name)
    if key not in _CUSTOM_CACHE:
        mod_spec = importlib.util.spec_from_file_location(f"asp_custom_reward_{len(_CUSTOM_CACHE)}", key[0])
        if mod_spec is None or mod_spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
        _CUSTOM_CACHE[key] = getattr(module, name)
    return _CUSTOM_CACHE[key]


def run_verifier(name: str, spec: RewardSpec, data_source: str, response: str, ground_truth: Any,
                 extra_info: Any = None) -> float:
    """One verifier's score (the pool's target: runs in a worker process).

    `custom` is called as verl calls `custom_reward_function`: `fn(data_source, solution_str,
    ground_truth, extra_info)`, returning a number or a dict with `score`."""
    if name == AUTO:
        return float(reward_fn_for(data_source, spec.partial)(response, ground_truth))
    if name == CUSTOM:
        out = _load_custom(spec.custom_function)(data_source, response, ground_truth, extra_info)
        return float(out["score"] if isinstance(out, dict) else out)
    return float(VERIFIERS[name](response, ground_truth))


@dataclass
class RewardResult:
    value: float
    parts: dict[str, float] = field(default_factory=dict)  # verifier -> its (unweighted) score
    failures: int = 0  # verifier calls that timed out or failed (each scored 0)


class RewardScorer:
    """Scores samples by a RewardSpec, every verifier call in the pool (one scorer per rollout instance)."""

    def __init__(self, spec: RewardSpec | None = None) -> None:
        self.spec = spec or RewardSpec()
        self.pool = VerifierPool(self.spec.num_workers, self.spec.timeout_s)

    def score(self, data_source: str, response: str, ground_truth: Any,
              extra_info: Any = None) -> RewardResult:
        out = RewardResult(0.0)
        for name, weight in self.spec.terms():
            value, status = self.pool.call(run_verifier, name, self.spec, data_source, response, ground_truth,
                                           extra_info)
            out.parts[name] = value
            out.failures += status != OK
            out.value += weight * value
        return out

    async def score_async(self, data_source: str, response: str, ground_truth: Any,
                          extra_info: Any = None) -> RewardResult:
        """`score` off the event loop (a rollout instance keeps decoding while verifiers run)."""
        return await asyncio.to_thread(self.score, data_source, response, ground_truth, extra_info)

    def stats(self) -> dict[str, int]:
        return self.pool.stats.as_dict()

    def close(self) -> None:
        self.pool.close()
