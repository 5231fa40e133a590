"""Exact answers from the event loop: hand-computed makespans, conservation, lag bound, synchrony."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.observe.bubbles import account
from asp_npu.sim.cost import SimCost, decode_seconds, steps_to_reach, train_seconds
from asp_npu.sim.engine import RunSpec, Simulation
from asp_npu.sim.modes import pull_source, static_source
from asp_npu.sim.workload import from_arrays

COST = SimCost(
    decode_a=1.0, decode_b=0.5, decode_c=0.0, prefill_s_per_token=0.0, train_s_per_token=0.1, refresh_s=0.0
)


def spec(**kw) -> RunSpec:
    base = dict(
        mode="t",
        colocated=False,
        instances=1,
        slots=8,
        instance_devices=1,
        trainer_devices=1,
        minibatch_groups=2,
        version_groups=2,
        max_lag=0,
        devices=2,
    )
    base.update(kw)
    return RunSpec(**base)


def test_decode_closed_form_matches_stepping() -> None:
    c = SimCost(decode_a=0.05, decode_b=0.001, decode_c=1e-5)
    k, n, kv = 37, 5, 120.0
    stepped = sum(0.05 + 0.001 * n + 1e-5 * (kv + n * j) for j in range(k))
    assert decode_seconds(c, k, n, kv) == pytest.approx(stepped, rel=1e-12)
    for dt in (0.0, 0.01, 0.3, 2.0):
        s = steps_to_reach(c, dt, n, kv)
        assert decode_seconds(c, s, n, kv) >= dt - 1e-12
        assert s == 0 or decode_seconds(c, s - 1, n, kv) < dt


def test_one_instance_equal_lengths() -> None:
    """4 samples of 10 tokens in 8 slots: 10 steps of (1 + 0.5*4) s, then 44 tokens x 0.1 s of training."""
    w = from_arrays(np.full((2, 2), 10), prompt_len=1)
    res = Simulation(spec(), w, COST, static_source(w, 1, "chunk")).run()
    assert res.iteration_ends == [pytest.approx(30.0 + 4.4)]
    assert res.tokens_generated == 40


def test_long_tail_makespan_by_hand() -> None:
    """2 slots, one group [4, 1, 1, 1]: steps of 2 s at batch 2 until t=6, then one step of 1.5 s alone."""
    w = from_arrays(np.array([[4, 1, 1, 1]]), prompt_len=1)
    res = Simulation(
        spec(slots=2, minibatch_groups=1, version_groups=1), w, COST, static_source(w, 1, "chunk")
    ).run()
    train = (5 + 2 + 2 + 2) * 0.1
    assert res.iteration_ends == [pytest.approx(7.5 + train)]
    # the rollout alone: the trainer starts exactly at the makespan
    busy = [t for t, s, _ in res.log.trainer if s == "busy"]
    assert busy == [pytest.approx(7.5)]


def test_skew_across_instances_by_hand() -> None:
    """Two instances, round robin: instance 0 gets the 8-token group, instance 1 the 2-token one."""
    w = from_arrays(np.array([[8, 8], [2, 2]]), prompt_len=1)
    res = Simulation(spec(instances=2, devices=3), w, COST, static_source(w, 2, "round_robin")).run()
    # instance 0: 8 steps of 2 s = 16 s; trainer: (9 * 2 + 3 * 2) tokens * 0.1
    assert res.iteration_ends == [pytest.approx(16.0 + 2.4)]
    b = account(res.log, 0.0, res.wall_s)
    # instance 1 generates for 4 s (2 steps at batch 2) then idles 12 s while instance 0 runs: skewness
    assert b.skewness * b.device_seconds == pytest.approx(12.0)
    assert b.coverage == pytest.approx(1.0)


def test_train_seconds_padded_vs_balanced() -> None:
    c = SimCost(train_s_per_token=1.0, train_dp_devices=1, micro_batch_size=2)
    tokens = np.array([10, 1, 1, 1])
    s_bal, u_bal = train_seconds(c, tokens, 2, padded=False)
    assert s_bal == pytest.approx(10.0) and u_bal == pytest.approx(13 / 20)
    s_pad, u_pad = train_seconds(c, tokens, 2, padded=True)  # ranks [10, 1] -> 20, [1, 1] -> 2
    assert s_pad == pytest.approx(20.0) and u_pad == pytest.approx(13 / 40)


def test_max_lag_zero_is_synchronous() -> None:
    """With max_lag 0 no sequence of the next iteration runs while the trainer trains."""
    rng = np.random.default_rng(3)
    w = from_arrays(rng.integers(1, 40, size=(12, 2)), prompt_len=2, prompts_per_iteration=4)
    res = Simulation(
        spec(instances=2, devices=3, minibatch_groups=2, version_groups=4, max_lag=0, dispatch="pull"),
        w,
        COST,
        pull_source(w),
    ).run()
    assert set(res.lags) == {0}
    busy = []
    tr = sorted(res.log.trainer)
    for k, (t, s, _) in enumerate(tr):
        if s == "busy":
            busy.append((t, tr[k + 1][0] if k + 1 < len(tr) else res.wall_s))
    for t, _, running, _ in res.log.inst:
        if running:
            assert not any(a < t < b for a, b in busy)


def _small_workload(lens: list[list[int]]):
    g = len(lens) - len(lens) % 2
    return from_arrays(np.array(lens[:g]), prompt_len=3, prompts_per_iteration=2)


def _small_sim(w, instances: int, slots: int, max_lag: int, dispatch: str, source, cost: SimCost,
               **kw) -> Simulation:
    """One version per minibatch of one group, a trainer device beside the instances."""
    return Simulation(
        spec(instances=instances, slots=slots, devices=instances + 1, minibatch_groups=1, version_groups=1,
             max_lag=max_lag, dispatch=dispatch),
        w, cost, source, **kw)


def _assert_conserved_and_lag_bounded(res, w, max_lag: int) -> None:
    assert res.tokens_generated == w.total_response_tokens
    assert res.samples_consumed == w.num_groups * w.group_size
    assert max(res.lags) <= max_lag and min(res.lags) >= 0


@settings(max_examples=25, deadline=None)
@given(
    lens=st.lists(st.lists(st.integers(1, 60), min_size=2, max_size=2), min_size=4, max_size=16),
    max_lag=st.integers(0, 2),
    instances=st.integers(1, 3),
    slots=st.integers(1, 6),
    pull=st.booleans(),
)
def test_conservation_and_lag_bound(lens, max_lag, instances, slots, pull) -> None:
    w = _small_workload(lens)
    cost = SimCost(
        decode_a=0.1,
        decode_b=0.01,
        decode_c=1e-4,
        prefill_s_per_token=1e-3,
        train_s_per_token=0.01,
        refresh_s=0.2,
    )
    src = pull_source(w) if pull else static_source(w, instances, "round_robin")
    res = _small_sim(w, instances, slots, max_lag, "pull" if pull else "static", src, cost).run()
    _assert_conserved_and_lag_bounded(res, w, max_lag)
    b = account(res.log, 0.0, res.wall_s)
    total = b.utilization + b.padding + b.skewness + b.sorting + b.overhead
    assert total == pytest.approx(1.0) and b.coverage == pytest.approx(1.0)


def test_work_pool_steals_only_undispatched_units_of_the_oldest_window() -> None:
    from asp_npu.core.feed import StaticFeed
    from asp_npu.core.records import Unit
    from asp_npu.sim.engine import WorkPool

    lanes = {0: [[[1], [2], [3]], []], 1: [[[4]], [[5]]]}

    def units_for(it):
        return [Unit(0, it, tuple(g), 2, k) for k, lane in enumerate(lanes[it]) for g in lane]

    pool = WorkPool(StaticFeed(2, steal=True), units_for, available=lambda it: it < 2, n_windows=2)
    u = pool.peek(1)  # instance 1 has nothing in window 0: takes instance 0's last unit there
    assert u.window == 0 and u.groups == (3,)
    pool.pop(u)
    assert pool.peek(0).groups == (1,)  # the owner keeps its own order
    no_steal = WorkPool(StaticFeed(2, steal=False), units_for, available=lambda it: it < 2, n_windows=2)
    u = no_steal.peek(1)  # without stealing it runs ahead into the next window
    assert (u.window, u.groups) == (1, (5,))


@settings(max_examples=25, deadline=None)
@given(
    lens=st.lists(st.lists(st.integers(1, 60), min_size=2, max_size=2), min_size=4, max_size=16),
    max_lag=st.integers(0, 2),
    instances=st.integers(1, 3),
    slots=st.integers(1, 6),
)
def test_stream_dispatcher_pick_conserves_and_bounds_lag(lens, max_lag, instances, slots) -> None:
    """The ASP stream path (global pending list, StreamDispatcher picks) keeps every invariant."""
    from asp_npu.core.records import Unit

    w = _small_workload(lens)
    longest = w.response_len.max(axis=1)

    def units_for(it):
        return [Unit(0, it, (int(g),), w.group_size, q90=float(longest[g])) for g in w.iteration_groups(it)]

    cost = SimCost(decode_a=0.1, decode_b=0.01, decode_c=1e-4, train_s_per_token=0.01, refresh_s=0.2)
    sim = _small_sim(w, instances, slots, max_lag, "stream", units_for, cost)
    d = sim.pool.feed.dispatcher
    res = sim.run()
    _assert_conserved_and_lag_bounded(res, w, max_lag)
    assert max(abs(x) for x in d.load) <= 1e-6 * max(1.0, float(w.response_len.max()) ** 2)
