"""Rule-based rewards: the synthetic tasks (exact match or partial credit) and a math verifier.

Why rule-based: GRPO on verifiable tasks needs no reward model, and the reward must be the same
function in tests, the simulator's traces and real training. The reward is chosen by the row's
`data_source` (verl convention): `asp/<task>` -> task reward, anything else -> math reward
(final `\\boxed{}` answer, else the last number; GSM8K ground truths `... #### 72` are understood).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from asp_npu.data.tasks import TASKS, answer_items

RewardFn = Callable[[str, Any], float]


def _norm_ws(text: str) -> str:
    return " ".join(text.split())


def task_reward(task: str, response: str, ground_truth: str, partial: bool = True) -> float:
    """1.0 for the exact answer; with `partial`, the share of answer items right in position.

    Partial credit divides by max(expected, produced) items, so padding an answer with extra
    items or stopping early both cost reward.
    """
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
    depth = 0
    for j in range(brace, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : j]
    return None


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
    """The reward function for a row's `data_source`."""
    if data_source.startswith("asp/") and data_source[4:] in TASKS:
        task = data_source[4:]
        return lambda response, truth: task_reward(task, response, str(truth), partial=partial)
    return math_reward


def compute_reward(data_source: str, response: str, ground_truth: Any, partial: bool = True) -> float:
    return float(reward_fn_for(data_source, partial)(response, ground_truth))
