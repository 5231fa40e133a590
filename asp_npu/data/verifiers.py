"""Rule verifiers by the names MindSpeed-RL's `rl_config.verifier_function` and verl's reward scores use.

Why these exact rules: a user comparing asp-npu with MindSpeed-RL or verl on "the same config" must get
the same reward for the same response, including each rule's score values and its quirks. Every
function here is `(response, ground_truth) -> float`, pure, and runs inside the verifier pool
(`asp_npu.data.reward_pool`), which bounds its time.

MindSpeed-RL (`mindspeed_rl/models/rule_verifier.py`):
- `format`: 1 if the response matches `^<think>.*?</think>\\s*<answer>.*?</answer>$` (DOTALL and
  MULTILINE, `re.match`: `$` may match at any line end, as there), else 0.
- `strict_format`: 1 if the response starts with `<think>`, ends with `</answer>`, holds exactly one
  `<think>`, `</think>`, `<answer>`, `</answer>` and one `\\boxed{...}` (on one line), in that order;
  else -0.5.
- `acc`: -1 without `boxed` in the response or with an empty boxed answer; else 1 when the last boxed
  answer (cleaned of `%`, `$`, degrees and a trailing unit, as Qwen's math-eval toolkit does) equals the
  ground truth, -0.5 when not.
- `base_acc`: 1 when the response fullmatches `<think>.*</think>.*<answer>.*\\boxed{.*}.*</answer>` and
  its last boxed answer equals the ground truth, else 0.
- `math_verify_reward`: the same format, then math-verify: gold `\\boxed{truth}` parsed as LaTeX, the
  whole response parsed as expression or LaTeX, `verify(gold, pred)` -> 1, else 0.
- `acc_for_dapo`: the DAPO/Minerva rule, as verl's `math_dapo` (below).
- `math_17k_acc` / `acc_for_ppo`: 1 when the last boxed answer equals the ground truth, else 0.
- `retool_reward` (multi-turn ReTool): the last boxed answer of the last 100 characters equals the
  ground truth exactly -> 1, else -1 (without MindSpeed-RL's per-tool-call bonus on wrong answers).
- `step`: a third per reasoning-step marker (`Step 1:`, `First,`, a list item, ...), at most 1.
"Equals" for `acc`, `base_acc`, `math_17k_acc` is `answers_equal`: equal after dropping `%` and
whitespace, else math-verify (MindSpeed-RL uses Qwen's math-eval `math_equal` and mathruler's
`grade_answer` there, both sympy-based; math-verify is the maintained library for the same job).

verl (`verl/utils/reward_score/`):
- `gsm8k`: the last `#### <number>` in the last 300 characters, commas and `$` removed, equal as a string
  to the ground truth -> 1, else 0.
- `math`: the last `\\boxed{...}` (or `\\boxed x`) content, normalised as Hendrycks' MATH (`math_normalize`),
  equal to the normalised ground truth -> 1, else 0.
- `math_dapo`: the last `Answer: ...` line in the last 300 characters, normalised as Minerva
  (`minerva_normalize`), equal to the normalised ground truth -> 1, else -1.
- `math_verify`: math-verify's verdict alone (no format check).
The agreement with the reference code on 74 hand-written cases, and the three deliberate differences,
are in docs/bench/rewards.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Verifier = Callable[[str, Any], float]

R1_FORMAT = re.compile(r"<think>.*</think>.*<answer>.*\\boxed\{.*\}.*</answer>", re.DOTALL)
_LOOSE_FORMAT = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>$", re.DOTALL | re.MULTILINE)
_BOXED_ONE_LINE = re.compile(r"\\boxed\{.*?\}")
_STOP_WORDS = ("</s>", "<|im_end|>", "<|endoftext|>")
CLIP_CHARS = 300  # verl and DAPO look at the last 300 characters only


def truth_text(ground_truth: Any) -> str:
    """A row's ground truth as text (a list holds alternatives: the first one counts)."""
    if isinstance(ground_truth, list | tuple):
        return str(ground_truth[0]) if ground_truth else ""
    return str(ground_truth)


# ------------------------------------------------------------------ boxed answers
def brace_end(text: str, start: int) -> int | None:
    """Index of the `}` closing the first `{` at or after `start` (None: unbalanced or no brace)."""
    depth = 0
    for j in range(start, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return None


def boxed_content(text: str) -> str | None:
    """Content of the last `\\boxed{...}` with balanced braces (mathruler / DAPO style); None if absent."""
    idx = text.rfind("\\boxed{")
    if idx < 0:
        return None
    end = brace_end(text, idx)
    return None if end is None else text[idx + len("\\boxed{"): end]


def _boxed_after_word(text: str) -> str:
    """Qwen math-eval extraction: what follows the last `boxed` word (braces balanced, else up to `$`)."""
    tail = text.split("boxed")[-1]
    if not tail:
        return ""
    if tail[0] != "{":
        return tail.split("$")[0].strip()
    end = brace_end(tail, 0)
    return tail[1:end] if end is not None else tail[1:].replace("{", "").replace("}", "")


def answers_equal(pred: str, truth: str) -> bool:
    """Same answer: equal without whitespace, else equal for math-verify (both parsed as boxed LaTeX).
    A percent sign is dropped first, as both MindSpeed-RL's graders do (`50\\%` answers `50`)."""
    pred, truth = (x.replace("\\%", "").replace("%", "") for x in (pred, truth))
    if "".join(pred.split()) == "".join(truth.split()):
        return True
    from math_verify import LatexExtractionConfig, parse, verify

    gold = parse("\\boxed{" + truth + "}", [LatexExtractionConfig()])
    got = parse("\\boxed{" + pred + "}", [LatexExtractionConfig()])
    return bool(gold and got and verify(gold, got))


# ------------------------------------------------------------------ MindSpeed-RL
def format_reward(response: str, ground_truth: Any = None) -> float:
    return 1.0 if _LOOSE_FORMAT.match(response) else 0.0


def _strict_structure(text: str) -> bool:
    tags = ("<think>", "</think>", "<answer>", "</answer>")
    if any(text.count(t) != 1 for t in tags) or len(_BOXED_ONE_LINE.findall(text)) != 1:
        return False
    boxed = _BOXED_ONE_LINE.search(text)
    pos = [text.find(t) for t in tags[:3]] + [boxed.start() if boxed else -1, text.find(tags[3])]
    return pos == sorted(pos) and text.startswith("<think>") and text.endswith("</answer>")


def strict_format_reward(response: str, ground_truth: Any = None) -> float:
    return 1.0 if _strict_structure(response) else -0.5


def acc_reward(response: str, ground_truth: Any) -> float:
    text = re.sub(r"^.*?<\|im_start\|>assistant", "<|im_start|>assistant", response, count=1, flags=re.DOTALL)
    for stop in _STOP_WORDS:
        if stop in text:
            text = text.split(stop)[0].strip()
    if "boxed" not in text:
        return -1.0
    got = _acc_clean(_boxed_after_word(text))
    if not got:
        return -1.0
    return 1.0 if answers_equal(got, truth_text(ground_truth)) else -0.5


def _acc_clean(answer: str) -> str:
    """The math-eval toolkit's clean-up of an extracted answer that math-verify does not do itself:
    line breaks, a leading `:` or trailing `.`, `%`, `$`, degrees, and a trailing `\\text{unit}`."""
    s = re.sub(r"\n\s*", "", answer).strip()
    s = s[1:] if s.startswith(":") else s
    s = s[:-1] if s.endswith(".") else s
    for mark in ("\\%", "%", "\\$", "$", "^{\\circ}", "^\\circ"):
        s = s.replace(mark, "")
    unitless = re.sub(r"\\text\{.*?\}$", "", s).strip()
    return unitless or s.strip()


def base_acc_reward(response: str, ground_truth: Any) -> float:
    if not R1_FORMAT.fullmatch(response):
        return 0.0
    got = boxed_content(response)
    return 1.0 if got is not None and answers_equal(got, truth_text(ground_truth)) else 0.0


def math_verify_score(response: str, ground_truth: Any) -> float:
    """math-verify's verdict alone (verl's `math_verify.compute_score`): gold boxed, prediction free-form."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold = parse("\\boxed{" + truth_text(ground_truth) + "}", [LatexExtractionConfig()])
    if not gold:
        return 0.0
    pred = parse(response, [ExprExtractionConfig(), LatexExtractionConfig()])
    return 1.0 if pred and verify(gold, pred) else 0.0


def math_verify_reward(response: str, ground_truth: Any) -> float:
    return math_verify_score(response, ground_truth) if R1_FORMAT.fullmatch(response) else 0.0


# ------------------------------------------------------------------ verl: gsm8k
def gsm8k_score(response: str, ground_truth: Any) -> float:
    found = re.findall(r"#### (\-?[0-9\.\,]+)", response[-CLIP_CHARS:])
    if not found:
        return 0.0
    return 1.0 if found[-1].replace(",", "").replace("$", "") == truth_text(ground_truth) else 0.0


# ------------------------------------------------------------------ verl: math (Hendrycks MATH)
def _verl_boxed(text: str) -> str | None:
    """The last boxed answer as verl's `math` finds it; None when absent or unbalanced.

    `\\boxed x` (a space, no brace) anywhere wins and runs to the next `$`; an `\\fbox{...}` is found but
    then rejected (verl's `remove_boxed` only accepts `\\boxed`), so it scores 0 as there."""
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    idx = text.rfind("\\boxed")
    if idx < 0:
        return None
    end = brace_end(text, idx)
    if end is None:
        return None
    span = text[idx: end + 1]
    return span[len("\\boxed{"): -1] if span.startswith("\\boxed{") else None


def _fix_sqrt(s: str) -> str:
    head, *rest = s.split("\\sqrt")
    return head + "".join("\\sqrt" + (part if part[0] == "{" else "{" + part[0] + "}" + part[1:])
                          for part in rest)


def _fix_fracs(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{2}` -> `\\frac{1}{2}`; a too-short tail leaves `s` as it was."""
    head, *rest = s.split("\\frac")
    out = head
    for part in rest:
        if part[0] == "{":
            out += "\\frac" + part
            continue
        if len(part) < 2:
            return s
        a, b, tail = part[0], part[1], part[2:]
        out += "\\frac{" + a + "}" + (b + tail if b == "{" else "{" + b + "}" + tail)
    return out


def _fix_slash(s: str) -> str:
    parts = s.split("/")
    if len(parts) != 2 or not all(re.fullmatch(r"-?\d+", p) for p in parts):
        return s
    a, b = int(parts[0]), int(parts[1])
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def math_normalize(s: str) -> str:
    """Hendrycks-MATH answer normalisation (as verl's `math` applies it). Raises on the malformed input
    that makes verl fall back to comparing the raw strings (a trailing `\\sqrt`, two `\\text{ ` units)."""
    for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"),
                     ("\\left", ""), ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", "")):
        s = s.replace(old, new)
    if "\\text{ " in s:  # units on the right
        units = s.split("\\text{ ")
        if len(units) != 2:
            raise ValueError("more than one unit")
        s = units[0]
    s = s.replace("\\\\%", "").replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "k = 3" -> "3"
        s = sides[1]
    s = _fix_fracs(_fix_sqrt(s).replace(" ", ""))
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_slash(s)


def math_score(response: str, ground_truth: Any) -> float:
    got = _verl_boxed(response)
    if got is None:
        return 0.0
    truth = truth_text(ground_truth)
    try:
        same = math_normalize(got) == math_normalize(truth)
    except (ValueError, IndexError):
        same = got == truth
    return 1.0 if same else 0.0


# ------------------------------------------------------------------ verl: math_dapo (Minerva)
_MINERVA_SUBSTITUTIONS = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)
# unit words and TeX spacing the Minerva paper's normaliser deletes (Lewkowycz et al. 2022, appendix)
_MINERVA_REMOVED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
    "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
    "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
    r",\!", "{,}", '"', "\\dots",
)


def minerva_normalize(answer: str) -> str:
    """Minerva's final-answer normalisation (as DAPO / verl `math_dapo` apply it)."""
    s = answer.split("=")[-1]
    for old, new in _MINERVA_SUBSTITUTIONS:
        s = s.replace(old, new)
    for word in _MINERVA_REMOVED:
        s = s.replace(word, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", s)
    for macro in ("text", "textbf", "overline"):
        s = re.sub(r"(\\" + macro + r"\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", s)
    s = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", s)
    s = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", s).replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def math_dapo_score(response: str, ground_truth: Any) -> float:
    found = re.findall(r"(?i)Answer\s*:\s*([^\n]+)", response[-CLIP_CHARS:])
    got = minerva_normalize(found[-1] if found else "[INVALID]")
    return 1.0 if got == minerva_normalize(truth_text(ground_truth)) else -1.0


def boxed_acc_reward(response: str, ground_truth: Any) -> float:
    """MindSpeed-RL `math_17k_acc` / `acc_for_ppo`: last boxed answer equals the truth -> 1, else 0."""
    got = boxed_content(response)
    return 1.0 if got is not None and answers_equal(got, truth_text(ground_truth)) else 0.0


_STEP_MARKERS = re.compile(r"(Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,)")


def steps_reward(response: str, ground_truth: Any = None) -> float:
    """MindSpeed-RL `step`: a third per reasoning-step marker, at most 1."""
    return min(1.0, len(_STEP_MARKERS.findall(response)) / 3)


def retool_reward(response: str, ground_truth: Any) -> float:
    """MindSpeed-RL `retool_reward` (multi-turn): the last `\\boxed{...}` in the response's last 100
    characters equals the ground truth as a string -> 1, else -1. MindSpeed-RL adds 0.1 per tool call to a
    wrong answer (at most up to 0) from its rollout's call counts; a verifier here sees the text only."""
    got = boxed_content(response[-100:])
    return 1.0 if got is not None and got == truth_text(ground_truth) else -1.0


MINDSPEED_VERIFIERS: dict[str, Verifier] = {
    "acc": acc_reward,
    "format": format_reward,
    "strict_format": strict_format_reward,
    "base_acc": base_acc_reward,
    "acc_for_dapo": math_dapo_score,
    "math_verify_reward": math_verify_reward,
    "math_17k_acc": boxed_acc_reward,
    "acc_for_ppo": boxed_acc_reward,
    "step": steps_reward,
    "retool_reward": retool_reward,
}
VERL_SCORES: dict[str, Verifier] = {
    "gsm8k": gsm8k_score,
    "math": math_score,
    "math_dapo": math_dapo_score,
    "math_verify": math_verify_score,
}
# verl's `default_compute_score`: which rule a row's data_source selects
VERL_SOURCES: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
    "math_dapo": "math_dapo",
    "math": "math_dapo",
    "math_dapo_reasoning": "math_dapo",
}


def verl_rule_for(data_source: str) -> str | None:
    """verl's score name for a data_source (None: verl has no rule for it)."""
    if data_source.startswith("aime"):
        return "math_dapo"
    return VERL_SOURCES.get(data_source)
