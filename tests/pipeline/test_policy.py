"""The dispatch and admission policy, the feeds and the window planner, driven without Ray."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.config import Config
from asp_npu.core.feed import PullFeed, StaticFeed, StreamFeed, make_feed
from asp_npu.core.modes import COLOCATED_MODES, MODES, REAL_MODES, TABLE, mode_spec, sim_mode
from asp_npu.core.policy import DispatchPolicy, Ports
from asp_npu.core.records import GroupKey, Unit
from asp_npu.core.shape import RunShape, shape_problems
from asp_npu.core.train_queue import TrainQueue
from asp_npu.core.window import WindowPlanner
from asp_npu.schedule.planner import PlannerConfig


def test_group_key_round_trips_the_wire_id():
    k = GroupKey("user@example", 3)
    assert str(k) == "user@example@3" and GroupKey.parse(str(k)) == k == ("user@example", 3)
    with pytest.raises(ValueError):
        GroupKey.parse("no-epoch")


def test_one_mode_table():
    assert set(MODES) == set(TABLE) and set(REAL_MODES) < set(MODES)
    assert COLOCATED_MODES == ("mindspeed-sync", "verl-sync")
    assert sim_mode("asp", "stream").dispatch == "stream" and sim_mode("asp", "unit").dispatch == "static"
    assert sim_mode("sortedrl", "unit").admission == "continuous"  # fixed admission
    assert TABLE["sortedrl"].colocated_in_sim and not TABLE["sortedrl"].colocated
    with pytest.raises(Exception, match="verl-sync"):
        mode_spec("verl-sync")


def test_run_shape_and_divisibility():
    cfg = Config()
    rl = cfg.rl_config
    rl.n_samples_per_prompt, rl.mini_batch_size, rl.global_batch_size = 4, 8, 6
    cfg.generate_config.num_instances, cfg.generate_config.infer_tensor_parallel_size = 2, 2
    sh = RunShape.from_config(cfg, devices=8, mode=mode_spec("mindspeed-sync"))
    assert (sh.window, sh.minibatch_groups, sh.steps_per_window, sh.steps_per_version) == (6, 2, 3, 3)
    assert (sh.max_lag, sh.instances, sh.version_groups) == (0, 4, 6)
    assert RunShape.from_config(cfg, devices=8, mode=mode_spec("asp")).instances == 2
    assert shape_problems(cfg) == []
    rl.global_batch_size = 3
    assert "not a whole number of minibatches" in shape_problems(cfg)[0]
    rl.mini_batch_size = 6
    assert "whole groups" in shape_problems(cfg)[0]


def _units(window: int, n: int, instances: int = 0, size: int = 1) -> list[Unit]:
    return [Unit(window * 100 + j, window, tuple(f"g{window}.{j}.{x}" for x in range(size)), 2,
                 j % instances if instances else -1) for j in range(n)]


def test_feeds_take_the_oldest_window_first():
    pull = PullFeed(2)
    pull.add(_units(0, 2))
    pull.add(_units(1, 1))
    order = []
    while (u := pull.peek(1)) is not None:
        pull.take(u)
        order.append(u.uid)
    assert order == [0, 1, 100] and pull.pending() == 0
    static = StaticFeed(2)
    static.add(_units(0, 3, instances=2))  # instance 0: 0, 2; instance 1: 1
    assert static.peek(1).uid == 1
    static.take(static.peek(1))
    assert static.peek(1) is None and static.peek(0).uid == 0
    stream = make_feed("stream", 2, version_groups=2)
    assert isinstance(stream, StreamFeed)
    units = [Unit(j, 0, (f"g{j}",), 2, q90=float(q)) for j, q in enumerate([5, 50, 10])]
    stream.add(units)
    assert stream.peek(0).groups == ("g1",)  # the least-loaded instance starts the longest group


class FakeWorld:
    """The pipeline's side effects without Ray: a real TrainQueue admits, instances record what they got."""

    def __init__(self, instances: int, max_lag: int, version_groups: int, minibatch_groups: int) -> None:
        self.queue = TrainQueue(minibatch_groups, version_groups, max_lag)
        self.held = [0] * instances
        self.sent: list[list[Unit]] = [[] for _ in range(instances)]
        self.blocked: dict[int, bool] = {}

    def ports(self, plan_next=lambda: False) -> Ports:
        def admit(unit: Unit, i: int) -> bool:
            if self.queue.capacity(self.held[i]) < len(unit.groups):
                return False
            for g in unit.groups:
                self.queue.admit(g, self.held[i], now=0.0)
            return True

        return Ports(admit, lambda i, u: self.sent[i].append(u),
                     lambda i, on: self.blocked.__setitem__(i, on), plan_next)


@settings(max_examples=60, deadline=None)
@given(windows=st.integers(1, 4), per_window=st.integers(1, 6), instances=st.integers(1, 3),
       max_lag=st.integers(0, 2), dispatch=st.sampled_from(["static", "pull", "stream"]),
       finish_order=st.randoms(use_true_random=False))
def test_policy_dispatches_every_planned_unit_once_within_the_lag_bound(
        windows, per_window, instances, max_lag, dispatch, finish_order):
    """Plan windows on demand, admit through the real TrainQueue, finish groups in any order and train:
    every planned group is generated and consumed exactly once and no handout exceeds the lag bound."""
    mode = mode_spec("asp" if dispatch != "pull" else "async-fifo",
                     "continuous" if dispatch == "stream" else "unit")
    assert mode.dispatch == dispatch
    world = FakeWorld(instances, max_lag, version_groups=1, minibatch_groups=1)
    policy = DispatchPolicy(make_feed(dispatch, instances, 1), mode, instances, slots=4)
    planned: list[Unit] = []

    def plan_next() -> bool:
        w = len(planned) // per_window
        if w >= windows:
            return False
        units = _units(w, per_window, instances if dispatch == "static" else 0)
        planned.extend(units)
        policy.add_window(units)
        return True

    consumed: list[str] = []
    for _ in range(10 * windows * per_window + 10):
        policy.dispatch(world.ports(plan_next))
        pending = [u for i in range(instances) for u in world.sent[i]
                   if policy.done_groups.get(u.uid, 0) < len(u.groups)]
        if pending:
            u = finish_order.choice(pending)
            g = u.groups[policy.done_groups.get(u.uid, 0)]
            world.queue.put(g, samples=2, tokens=2, now=0.0)
            policy.arrived(g)
        while (h := world.queue.get(now=0.0)) is not None:
            assert max(h.lags) <= max_lag
            consumed += [x.group_id for x in h.groups]
            world.held = [world.queue.trainer_step] * instances  # every instance refreshed at once
        if not pending and len(planned) == windows * per_window and policy.feed.pending() == 0:
            break
    groups = [g for u in planned for g in u.groups]
    assert len(planned) == windows * per_window
    assert sorted(consumed) == sorted(groups)  # every planned group generated and consumed once
    assert all(not s for s in policy.inflight)


def test_policy_withholds_a_unit_the_lag_bound_refuses_and_marks_the_instance_blocked():
    mode = mode_spec("async-fifo", "unit")
    world = FakeWorld(instances=1, max_lag=0, version_groups=1, minibatch_groups=1)
    policy = DispatchPolicy(PullFeed(1), mode, 1, slots=4)
    policy.add_window(_units(0, 3))
    sent = policy.dispatch(world.ports())
    assert [u.uid for _, u in sent] == [0] and world.blocked[0] is False  # lag 0: one version in flight
    assert policy.feed.pending() == 2


def test_window_planner_units_cover_the_window_in_dispatch_order():
    keys = [f"p{i}@0" for i in range(12)]
    rng = np.random.default_rng(0)
    plens = rng.integers(5, 50, size=12)
    base = PlannerConfig(num_instances=3, minibatch=8, group_size=4, max_num_seqs=8, max_lag=1)

    class Pred:
        def predict_many(self, ids, plen):
            m = np.linspace(5, 200, len(ids))
            return type("E", (), {"mean": m, "q50": m, "q90": 1.5 * m})

    for name, adm, dispatch in [("asp", "unit", "static"), ("asp", "continuous", "stream"),
                                ("async-fifo", "unit", "pull")]:
        wp = WindowPlanner(mode_spec(name, adm), 4, base, Pred()).plan(0, keys, np.array(keys), plens, seed=1)
        got = [g for u in wp.units for g in u.groups]
        assert sorted(got) == sorted(keys) and len(got) == len(keys)
        assert all(u.window == 0 and (u.instance >= 0) == (dispatch == "static") for u in wp.units)
        assert wp.plan is not None
        samples = {}
        for du in (wp.plan.unit(j) for j in range(wp.plan.num_units)):
            samples[du.samples[0].prompt_id] = [(x.prompt_id, x.sample_idx) for x in du.samples]
        for u in wp.units:  # a unit's samples are the plan's samples, group-major
            if dispatch != "stream":
                assert list(u.samples) == samples[u.groups[0]]
