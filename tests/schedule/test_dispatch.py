"""StreamDispatcher: the long tail is spread over instances, loads are conserved, choices are valid."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.schedule.dispatch import StreamDispatcher, smooth_order


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


@settings(max_examples=100, deadline=None)
@given(lens=st.lists(st.integers(1, 20_000), min_size=1, max_size=80), size=st.integers(1, 12))
def test_smooth_order_deals_long_and_short_evenly_over_slices(lens, size) -> None:
    order = smooth_order(lens, size)
    assert sorted(order) == list(range(len(lens)))
    k = -(-len(lens) // size)
    slices = [order[j * size:(j + 1) * size] for j in range(k)] if len(lens) % size == 0 else None
    ranked = sorted(range(len(lens)), key=lambda i: (-lens[i], i))
    pos = {i: r for r, i in enumerate(ranked)}
    if slices is not None:  # whole slices: each holds one of every k consecutive ranks
        for t in range(0, len(lens), k):
            top = set(ranked[t:t + k])
            assert [len(top & set(sl)) for sl in slices] == [1] * k
        for sl in slices:  # longest first within a slice
            assert [pos[i] for i in sl] == sorted(pos[i] for i in sl)


def test_single_instance_admits_mixed_slices_not_longest_first() -> None:
    d = StreamDispatcher(1, slice_groups=2)
    pending = ["s1", "l1", "s2", "l2"]
    d.add(pending, [10.0, 190.0, 20.0, 180.0])
    first_slice = [pending.pop(d.choose(pending, 0)) for _ in range(2)]
    assert first_slice == ["l1", "s1"]  # the longest with the shortest (snake), not l1 + l2
    lpt = StreamDispatcher(1)  # without slices: longest first
    lpt.add(["s1", "l1"], [10.0, 190.0])
    assert lpt.choose(["s1", "l1"], 0) == 1


def test_bad_inputs() -> None:
    with pytest.raises(ValueError):
        StreamDispatcher(0)
    with pytest.raises(ValueError):
        StreamDispatcher(1).choose([], 0)
    with pytest.raises(ValueError):
        StreamDispatcher(1, slice_groups=-1)


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
