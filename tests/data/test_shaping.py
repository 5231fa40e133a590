"""DAPO overlong reward shaping and the dynamic-sampling rules, on hand-built answers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asp_npu.data.rewards import compute_reward
from asp_npu.data.shaping import (
    DapoShaping,
    equal_rewards,
    filter_budget,
    overlong_penalty,
    shaped_rewards,
)

# DAPO's example: max response 20,480 tokens, buffer 4,096, factor 1.0 -> no penalty up to 16,384
CASES = [  # (response tokens, penalty)
    (100, 0.0),
    (16_384, 0.0),  # exactly L_max - L_buf: still free
    (16_385, -1 / 4096),
    (18_432, -0.5),  # half-way into the buffer
    (20_480, -1.0),  # at the cap: the whole factor
]


@pytest.mark.parametrize(("length", "penalty"), CASES)
def test_overlong_penalty_is_dapos_linear_ramp(length, penalty):
    assert overlong_penalty(length, 20_480, 4_096, 1.0) == pytest.approx(penalty, abs=1e-12)


def test_penalty_factor_scales_and_zero_buffer_disables():
    assert overlong_penalty(18_432, 20_480, 4_096, 0.5) == pytest.approx(-0.25)
    assert overlong_penalty(20_480, 20_480, 0, 1.0) == 0.0


def test_hand_built_answers_get_the_documented_reward():
    """A right and a wrong math answer, short and long, scored by the reward function then shaped
    (max_tokens 64, buffer 16, factor 1): the long right one loses (len - 48) / 16."""
    s = DapoShaping(overlong=True, max_tokens=64, overlong_buffer=16, penalty_factor=1.0)
    answers = ["The answer is \\boxed{42}", "The answer is \\boxed{41}", "so \\boxed{42}", "so \\boxed{41}"]
    # data_source "" scores with the lenient boxed/last-number rule ("math" is verl's math_dapo,
    # which wants "Answer: 42")
    raw = [compute_reward("", a, "42") for a in answers]
    assert raw == [1.0, 0.0, 1.0, 0.0]
    lengths = [10, 48, 56, 64]  # tokens of each response (the engine's count)
    assert shaped_rewards(raw, lengths, s) == pytest.approx([1.0, 0.0, 0.5, -1.0])
    off = DapoShaping(overlong=False, max_tokens=64, overlong_buffer=16)
    assert shaped_rewards(raw, lengths, off) == raw


@given(max_tokens=st.integers(2, 4096), data=st.data())
def test_penalty_bounded_and_monotone(max_tokens, data):
    buf = data.draw(st.integers(1, max_tokens - 1))
    factor = data.draw(st.floats(0, 4))
    lens = sorted(data.draw(st.lists(st.integers(0, max_tokens), min_size=2, max_size=8)))
    pens = [overlong_penalty(n, max_tokens, buf, factor) for n in lens]
    assert all(-factor - 1e-9 <= p <= 0.0 for p in pens)
    assert all(a >= b for a, b in zip(pens, pens[1:], strict=False))  # longer never better
    assert overlong_penalty(max_tokens - buf, max_tokens, buf, factor) == 0.0


def test_equal_rewards_and_budget():
    assert equal_rewards([1.0, 1.0, 1.0]) and equal_rewards([0.0])
    assert not equal_rewards([1.0, 0.0, 1.0])
    assert filter_budget(10, 6, 3) == 9 * 6 * 3
    assert filter_budget(1, 6, 3) == 0  # one generation batch per training batch: never filter
    assert filter_budget(0, 6, 3) is None and filter_budget(-1, 6, 3) is None  # verl: no cap
