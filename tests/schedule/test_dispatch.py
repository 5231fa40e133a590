"""StreamDispatcher: the long tail is spread over instances, loads are conserved, choices are valid."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.schedule.dispatch import StreamDispatcher


def test_longest_groups_land_on_distinct_instances() -> None:
    d = StreamDispatcher(3)
    pending = [f"g{i}" for i in range(9)]
    d.add(pending, [100, 9000, 200, 8000, 300, 7000, 400, 500, 600])
    placed: dict[int, list[str]] = {0: [], 1: [], 2: []}
    for i in (0, 1, 2):  # a version's opening burst: every instance asks once
        placed[i].append(pending.pop(d.choose(pending, i)))
    assert sorted(g for gs in placed.values() for g in gs) == ["g1", "g3", "g5"]
    # now instance 0 carries the most load: it gets the shortest pending group, not another long one
    assert pending[d.choose(pending, 0)] == "g0"


def test_done_frees_load_and_unknown_ids_are_ignored() -> None:
    d = StreamDispatcher(2)
    d.add(["a", "b"], [10.0, 20.0])
    d.choose(["a", "b"], 1)
    assert d.load[1] == pytest.approx(0.5 * 20.0**2)
    d.done("b")
    d.done("never-dispatched")
    assert d.load == [0.0, 0.0]


def test_unplace_undoes_a_choice_but_keeps_the_prediction() -> None:
    d = StreamDispatcher(2)
    d.add(["a", "b"], [10.0, 4.0])
    assert d.choose(["a", "b"], 0) == 0 and d.load[0] == 50.0
    d.unplace("a")
    assert d.load == [0.0, 0.0] and d.weight("a") == 50.0
    assert d.choose(["a", "b"], 1) == 0 and d.load == [0.0, 50.0]


def test_bad_inputs() -> None:
    with pytest.raises(ValueError):
        StreamDispatcher(0)
    with pytest.raises(ValueError):
        StreamDispatcher(1).choose([], 0)


@settings(max_examples=50, deadline=None)
@given(
    lens=st.lists(st.integers(1, 20_000), min_size=1, max_size=60),
    k=st.integers(1, 6),
    asks=st.lists(st.integers(0, 5), min_size=1, max_size=200),
)
def test_every_group_dispatched_once_and_load_returns_to_zero(lens, k, asks) -> None:
    d = StreamDispatcher(k)
    pending = list(range(len(lens)))
    d.add(pending, lens)
    taken = []
    for i in asks:
        if not pending:
            break
        j = d.choose(pending, i % k)
        assert 0 <= j < len(pending)
        taken.append(pending.pop(j))
    assert len(set(taken)) == len(taken)
    assert sum(d.load) == pytest.approx(sum(0.5 * lens[g] ** 2 for g in taken))
    for g in taken:
        d.done(g)
    assert max(abs(x) for x in d.load) <= 1e-6 * max(1.0, max(lens) ** 2)


@settings(max_examples=30, deadline=None)
@given(lens=st.lists(st.integers(1, 20_000), min_size=2, max_size=40), k=st.integers(2, 6))
def test_top_k_predicted_spread_over_k_instances_in_a_burst(lens, k) -> None:
    """When every instance asks in turn from equal loads, the k longest land on k distinct instances."""
    d = StreamDispatcher(k)
    pending = list(range(len(lens)))
    d.add(pending, lens)
    where = {}
    for i in range(min(k, len(lens))):
        where[pending.pop(d.choose(pending, i))] = i
    top = sorted(range(len(lens)), key=lambda g: (-lens[g], g))[: min(k, len(lens))]
    assert sorted(lens[g] for g in where) == sorted(lens[g] for g in top)
    assert len(set(where.values())) == len(where)
