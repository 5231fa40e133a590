"""Hypothesis properties of every plan (ASP and the baselines) on many input shapes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asp_npu.schedule import planner
from asp_npu.schedule.baselines import fifo_plan, karmarkar_karp, random_plan
from asp_npu.schedule.padding import length_order
from asp_npu.schedule.plan import RolloutPlan
from asp_npu.schedule.planner import POLISH_WINDOW_ROWS, PlannerConfig, check_lag_bound, plan

from .helpers import SHAPES, make_groups


@st.composite
def cases(draw):
    g = draw(st.sampled_from([1, 2, 3, 4, 8]))
    n_groups = draw(st.integers(1, 70))
    shape = draw(st.sampled_from(SHAPES))
    cfg = PlannerConfig(
        num_instances=draw(st.integers(1, 12)),
        minibatch=g * draw(st.integers(1, 7)),
        group_size=g,
        max_num_seqs=draw(st.integers(1, 40)),
        max_lag=draw(st.integers(0, 3)),
        train_step_s=draw(st.sampled_from([0.0, 0.5, 30.0])),
        seed=draw(st.integers(0, 3)),
        split_units=draw(st.booleans()),
    )
    return make_groups(n_groups, g, shape, draw(st.integers(0, 10_000))), cfg


def _check(groups, cfg, result: RolloutPlan) -> None:
    # every sample exactly once
    got = sorted(zip(result.sample_prompt_ids.tolist(), result.sample_idx.tolist(), strict=True))
    want = sorted(
        (p, int(s))
        for p, row in zip(groups.prompt_ids.tolist(), groups.sample_idxs, strict=True)
        for s in row
    )
    assert got == want
    # groups intact: all of a group's samples in one unit (hence one instance), contiguous
    unit_of = result.sample_unit
    for gi in np.unique(result.sample_group):
        rows = np.flatnonzero(result.sample_group == gi)
        assert rows.size == cfg.group_size and np.all(np.diff(rows) == 1)
        assert np.unique(unit_of[rows]).size == 1
    # unit size: whole groups, at most a minibatch
    sizes = result.unit_sizes
    assert np.all(sizes > 0) and np.all(sizes % cfg.group_size == 0) and np.all(sizes <= cfg.minibatch)
    assert np.all(result.unit_instance >= 0) and np.all(result.unit_instance < cfg.num_instances)
    # instances run their units back to back or later, never overlapping
    for ids in result.instance_units:
        assert np.all(result.unit_start[ids][1:] >= result.unit_finish[ids][:-1] - 1e-9)
    # the lag bound, checked independently of the planner's bookkeeping
    assert check_lag_bound(result, cfg) == []
    assert result.summary["max_planned_lag"] <= cfg.max_lag
    assert result.summary["predicted_makespan"] >= result.summary["lower_bound"] * (1 - 1e-9)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_asp_plan_properties(case) -> None:
    groups, cfg = case
    result = plan(groups, cfg)
    _check(groups, cfg, result)
    # deterministic for a seed
    again = plan(groups, cfg)
    assert np.array_equal(again.sample_group, result.sample_group)
    assert np.array_equal(again.unit_instance, result.unit_instance)
    assert np.array_equal(again.unit_start, result.unit_start)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_baseline_plan_properties(case) -> None:
    groups, cfg = case
    for fn in (fifo_plan, random_plan):
        _check(groups, cfg, fn(groups, cfg))


@settings(max_examples=25, deadline=None)
@given(cases())
def test_json_roundtrip(case) -> None:
    groups, cfg = case
    result = plan(groups, cfg)
    back = RolloutPlan.from_json(result.to_json())
    assert np.array_equal(back.sample_prompt_ids, result.sample_prompt_ids)
    assert np.array_equal(back.sample_idx, result.sample_idx)
    assert np.array_equal(back.unit_offsets, result.unit_offsets)
    assert np.array_equal(back.unit_instance, result.unit_instance)
    assert np.array_equal(back.unit_target_step, result.unit_target_step)
    assert np.allclose(back.unit_start, result.unit_start, rtol=1e-5)
    assert back.summary == result.summary


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_asp_balance_and_homogeneity(case) -> None:
    """Skewness bound: instance token loads differ by at most the largest unit (rows dealt heaviest
    to least loaded, leftover units longest first, swaps that only lower the larger of two loads);
    padding kept: a unit's groups lie within K*c + 2*POLISH_WINDOW_ROWS*K consecutive length ranks."""
    groups, cfg = case
    result = plan(groups, cfg)
    n = cfg.group_size
    first = np.arange(0, result.num_samples, n)
    g_of = result.sample_group[first]
    u_of = result.sample_unit[first]
    k = cfg.num_instances
    loads = np.bincount(result.unit_instance[u_of], weights=groups.mean[g_of], minlength=k)
    unit_tokens = np.bincount(u_of, weights=groups.mean[g_of])
    if result.num_units >= k:
        assert loads.max() - loads.min() <= unit_tokens.max() * (1 + 1e-9) + 1e-9
    rank = np.empty(len(groups), dtype=np.int64)
    rank[length_order(groups.mean, cfg.seed)] = np.arange(len(groups))
    c = int(result.unit_sizes.max()) // n
    r = rank[g_of]
    span = np.maximum.reduceat(r, np.flatnonzero(np.r_[True, u_of[1:] != u_of[:-1]]))
    span -= np.minimum.reduceat(r, np.flatnonzero(np.r_[True, u_of[1:] != u_of[:-1]]))
    assert span.max() <= k * c - 1 + 2 * POLISH_WINDOW_ROWS * k


def _token_loads(groups, result: RolloutPlan, k: int) -> np.ndarray:
    first = np.arange(0, result.num_samples, groups.group_size)
    inst = result.unit_instance[result.sample_unit[first]]
    return np.bincount(inst, weights=groups.mean[result.sample_group[first]], minlength=k)


def _busy(result: RolloutPlan, k: int) -> np.ndarray:
    """Predicted busy seconds per instance (a unit runs from its planned start to its finish)."""
    return np.bincount(result.unit_instance, weights=result.unit_finish - result.unit_start, minlength=k)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_recut_units_only_even_the_loads(case) -> None:
    """Smaller units (re-cut where full units are too coarse) never raise the busiest instance's
    predicted tokens; by default they never make a blocking per-unit executor busier on the cost
    model (busiest instance no longer, total at most RECUT_BUSY_SLACK more); split_units balances
    at least as well as the default; max_lag 0 keeps full units."""
    groups, cfg = case
    k = cfg.num_instances
    saved = planner.RECUT_TRIGGER
    planner.RECUT_TRIGGER = float("inf")
    try:
        whole = plan(groups, replace(cfg, split_units=False))
    finally:
        planner.RECUT_TRIGGER = saved
    default = plan(groups, replace(cfg, split_units=False))
    split = plan(groups, replace(cfg, split_units=True))
    top = [_token_loads(groups, p, k).max() for p in (whole, default, split)]
    assert top[2] <= top[1] * (1 + 1e-9) + 1e-9 and top[1] <= top[0] * (1 + 1e-9) + 1e-9
    b_whole, b_default = _busy(whole, k), _busy(default, k)
    assert b_default.max() <= b_whole.max() * (1 + 1e-6) + 1e-9
    assert b_default.sum() <= b_whole.sum() * (1 + planner.RECUT_BUSY_SLACK + 1e-6) + 1e-9
    if cfg.max_lag == 0 or k == 1:
        for p in (default, split):
            assert np.array_equal(p.unit_offsets, whole.unit_offsets)
            assert np.array_equal(p.unit_instance, whole.unit_instance)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.5, 1e5), min_size=1, max_size=200),
    st.integers(1, 12),
)
def test_karmarkar_karp_partitions_every_item_once(weights, k) -> None:
    w = np.asarray(weights)
    part = karmarkar_karp(w, k)
    assert part.shape == w.shape and part.min() >= 0 and part.max() < k
    loads = np.bincount(part, weights=w, minlength=k)
    # largest differencing never ends further apart than the largest item
    assert loads.max() - loads.min() <= w.max() * (1 + 1e-9)
    if w.size >= k:
        assert np.unique(part).size == k
