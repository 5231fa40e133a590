"""The lag rule: the AReaL formula, its ledger generalisation, and the handout condition."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.core.staleness import (
    areal_capacity,
    handout_feasible,
    handout_need,
    lag_ok,
    ledger_capacity,
)


def test_areal_formula_by_hand() -> None:
    # max_lag 1, version 0, batch 4: (1 + 0 + 1) * 4 - (0 + 3) = 5, capped by 8 - 2 slots
    assert areal_capacity(8, 6, 1, 0, 4, 0, 3) == 2
    assert areal_capacity(100, 0, 1, 0, 4, 0, 3) == 5
    assert areal_capacity(100, 0, 0, 2, 4, 8, 4) == 0  # synchronous: full batch in flight


def test_lag_ok() -> None:
    assert lag_ok(3, 3, 0) and lag_ok(3, 1, 2)
    assert not lag_ok(3, 0, 2) and not lag_ok(3, 4, 2)


@given(
    max_lag=st.integers(0, 4),
    batch=st.integers(1, 6),
    version=st.integers(0, 5),
    in_flight=st.integers(0, 30),
)
def test_ledger_equals_areal_when_in_order(max_lag: int, batch: int, version: int, in_flight: int) -> None:
    """Instances at the trainer's version and everything outstanding admitted at most at that version."""
    consumed = version * batch
    # all outstanding were admitted at versions <= current, their deadlines <= version + max_lag
    outstanding = {version + max_lag: in_flight} if in_flight else {}
    expect = max(0, areal_capacity(10**9, 0, max_lag, version, batch, consumed, in_flight))
    assert ledger_capacity(version, max_lag, batch, consumed, outstanding) == expect


def test_out_of_order_straggler_is_protected() -> None:
    """max_lag 1, batch 2: the AReaL count would keep admitting while an old group is still running;
    the ledger stops once the old group's deadline window is full."""
    V, L = 2, 1
    # four groups admitted at version 0 (deadline 1); two consumed at step 0; one still running
    outstanding = {1: 2}
    assert ledger_capacity(1, L, V, 2, outstanding) == 2  # new ones have deadline 2: positions 2..5 free
    # a step-1 handout must contain both remaining version-0 groups
    assert handout_need(V, 2, 2, outstanding) == [(1, 2)]
    assert not handout_feasible([1, 2], handout_need(V, 2, 2, {1: 2, 2: 2}))
    assert handout_feasible([1, 1], handout_need(V, 2, 2, {1: 2, 2: 2}))


@settings(max_examples=200)
@given(
    counts=st.dictionaries(st.integers(0, 6), st.integers(1, 5), max_size=4),
    version=st.integers(0, 6),
    max_lag=st.integers(0, 3),
    V=st.integers(1, 5),
)
def test_ledger_capacity_never_negative_and_admitting_it_keeps_hall(counts, version, max_lag, V) -> None:
    consumed = 0
    cap = ledger_capacity(version, max_lag, V, consumed, counts)
    assert cap >= 0
    after = dict(counts)
    d0 = version + max_lag
    after[d0] = after.get(d0, 0) + cap
    # if the ledger was consistent before, it stays consistent for d >= d0 after admitting `cap`
    acc = 0
    for d in sorted(after):
        acc += after[d]
        if d >= d0 and cap > 0:
            assert acc <= (d + 1) * V - consumed
