"""The verifiers on a table of hand-written (response, ground truth) pairs agree with the reference
implementations (MindSpeed-RL's rule_verifier, verl's reward_score; `reward_expected.py`), and
`math_verify_reward` with math-verify's own parse/verify; every verifier returns only its documented
scores, whatever the text."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.data.verifiers import MINDSPEED_VERIFIERS, VERL_SCORES
from tests.data.reward_cases import CASES
from tests.data.reward_expected import DIFFERENCES, EXPECTED, ORDER

VERIFIERS = {**MINDSPEED_VERIFIERS, **VERL_SCORES}


def test_the_table_is_large_and_covers_every_case():
    ids = [c[0] for c in CASES]
    assert len(ids) >= 60 and len(set(ids)) == len(ids)
    assert set(ids) == set(EXPECTED) and all(len(v) == len(ORDER) for v in EXPECTED.values())
    assert set(ORDER) <= set(VERIFIERS)


@pytest.mark.parametrize("name", ORDER)
def test_verifier_agrees_with_the_reference(name: str):
    col = ORDER.index(name)
    wrong = []
    for case, response, truth in CASES:
        want = DIFFERENCES.get((name, case), (EXPECTED[case][col], ""))[0]
        got = VERIFIERS[name](response, truth)
        if got != want:
            wrong.append(f"{case}: want {want}, got {got}")
    assert not wrong, wrong
    scores = {EXPECTED[c][col] for c in EXPECTED}
    assert len(scores) > 1, f"{name}: the table never varies its score"


R1 = re.compile(r"<think>.*</think>.*<answer>.*\\boxed\{.*\}.*</answer>", re.DOTALL)


@pytest.mark.parametrize("case,response,truth", CASES, ids=[c[0] for c in CASES])
def test_math_verify_reward_is_math_verify(case: str, response: str, truth: str):
    """MindSpeed-RL's math_verify_reward: the R1 format, then math-verify's verdict on the whole response."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold = parse("\\boxed{" + truth + "}", [LatexExtractionConfig()])
    pred = parse(response, [ExprExtractionConfig(), LatexExtractionConfig()])
    want = 1.0 if R1.fullmatch(response) and gold and pred and verify(gold, pred) else 0.0
    assert VERIFIERS["math_verify_reward"](response, truth) == want


SCORES = {
    "acc": {1.0, -0.5, -1.0}, "format": {0.0, 1.0}, "strict_format": {1.0, -0.5}, "base_acc": {0.0, 1.0},
    "acc_for_dapo": {1.0, -1.0}, "math_verify_reward": {0.0, 1.0}, "math_17k_acc": {0.0, 1.0},
    "acc_for_ppo": {0.0, 1.0}, "gsm8k": {0.0, 1.0}, "math": {0.0, 1.0}, "math_dapo": {1.0, -1.0},
    "math_verify": {0.0, 1.0},
}
PIECES = st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", "\\boxed{", "}", "{", "\\boxed ",
                          "\\fbox{", "#### ", "Answer: ", "\n", " ", "$", "12", "-3", "\\frac{1}{2}", "x=",
                          "\\text{ cm}", "3/4", ",", ".", "Step 1:", "\\sqrt", "\\%"])


@settings(max_examples=60, deadline=None)
@given(st.lists(PIECES, max_size=14).map("".join), st.sampled_from(["12", "\\frac{1}{2}", "-3", "3/4"]))
def test_every_verifier_returns_only_its_documented_scores(response: str, truth: str):
    for name, allowed in SCORES.items():
        assert VERIFIERS[name](response, truth) in allowed, name
    assert 0.0 <= VERIFIERS["step"](response, truth) <= 1.0
