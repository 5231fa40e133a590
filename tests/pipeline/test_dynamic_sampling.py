"""DAPO dynamic sampling's accounting: filtered groups are consumed (never lost, never trained twice),
replacements keep every minibatch whole, the lag bound holds, the run's cap is kept (pure logic, plus
the queue actor in-process)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.core.train_queue import TrainQueue
from asp_npu.core.window import GroupSupply
from asp_npu.data.shaping import DapoShaping, equal_rewards, filter_budget
from asp_npu.pipeline.queue_actor import QueueService
from asp_npu.types import Trajectory

ops = st.lists(st.tuples(st.sampled_from(["admit", "finish", "get", "refresh"]), st.integers(0, 50)),
               max_size=120)


class _Run:
    """The controller's rules over a TrainQueue: plan replacements, admit, finish (filter or queue),
    hand out -- with each group's 'all rewards equal' drawn in advance."""

    def __init__(self, q: TrainQueue, window: int, target: int, budget: int | None, equal: list[bool]):
        self.q, self.window, self.target, self.budget, self.equal = q, window, target, budget, equal
        self.planned = self.filtered = 0
        self.pending: list[int] = []
        self.running: list[int] = []
        self.admitted: list[int] = []
        self.filtered_ids: list[int] = []
        self.consumed: list[int] = []
        self.inst_version = 0

    def plan(self) -> None:
        short = GroupSupply(self.planned, self.filtered).shortfall(self.target)
        if not self.pending and short > 0:
            k = min(self.window, short)
            self.pending = list(range(self.planned, self.planned + k))
            self.planned += k

    def admit(self, x: int) -> None:
        self.plan()
        cap = self.q.capacity(self.inst_version)
        for _ in range(min(cap, len(self.pending), 1 + x % 4)):
            g = self.pending.pop(0)
            self.q.admit(g, self.inst_version)
            self.running.append(g)
            self.admitted.append(g)

    def finish(self, x: int) -> None:
        if not self.running:
            return
        g = self.running.pop(x % len(self.running))
        within = self.budget is None or self.q.filtered < self.budget
        if within and self.equal[g % len(self.equal)]:
            self.q.discard(g)
            self.filtered += 1
            self.filtered_ids.append(g)
        else:
            self.q.put(g, samples=4, tokens=x)

    def get(self) -> bool:
        h = self.q.get()
        if h is None:
            return False
        assert len(h.groups) == self.q.minibatch_groups  # every step whole
        assert all(0 <= lag <= self.q.max_lag for lag in h.lags)
        self.consumed += [g.group_id for g in h.groups]
        return True


@settings(max_examples=300, deadline=None)
@given(mb=st.integers(1, 3), mult=st.integers(1, 2), max_lag=st.integers(0, 2), windows=st.integers(1, 3),
       max_batches=st.integers(0, 4), equal=st.lists(st.booleans(), min_size=1, max_size=12), program=ops)
def test_filtered_groups_are_consumed_and_replaced(mb, mult, max_lag, windows, max_batches, equal, program):
    V = mb * mult
    window, steps = V, windows * mult  # one window = one weights version of groups
    target = steps * mb
    budget = filter_budget(max_batches, window, windows)
    if budget is None:
        equal = [*equal, False]  # no cap: the data must hold a learnable group, else no run ends
    run = _Run(TrainQueue(mb, V, max_lag), window, target, budget, equal)
    for op, x in program:
        if op == "admit":
            run.admit(x)
        elif op == "finish":
            run.finish(x)
        elif op == "get" and len(run.consumed) < target:
            run.get()
        elif op == "refresh":
            run.inst_version = run.q.trainer_step
    for _ in range(10_000):  # drain: the run must reach its last step (no deadlock, nothing lost)
        if len(run.consumed) >= target:
            break
        run.inst_version = run.q.trainer_step
        run.admit(3)
        while run.running:
            run.finish(0)
        while len(run.consumed) < target and run.get():
            pass
    assert len(run.consumed) >= target, "filtered groups were not replaced"
    assert len(run.consumed) == len(set(run.consumed))  # no group trained twice
    assert not set(run.consumed) & set(run.filtered_ids)  # a filtered group is never trained
    assert len(run.filtered_ids) == len(set(run.filtered_ids)) == run.q.filtered
    queued = {g.group_id for g in run.q.snapshot()[1]}
    # never lost: every admitted group is trained, filtered, queued or still running
    assert sorted(run.admitted) == sorted([*run.consumed, *run.filtered_ids, *queued, *run.running])
    assert budget is None or run.q.filtered <= budget
    if budget is not None:  # the cap on generation: filter_groups_max_batches windows per iteration
        assert run.planned <= target + budget
    assert run.q.summary()["filtered_groups"] == run.q.filtered


def _group(gid: str, rewards: list[float], lengths: list[int]) -> list[Trajectory]:
    return [Trajectory(gid, k, [1, 2], [5] * n, [-0.1] * n, "stop", r, 0, instance=0)
            for k, (r, n) in enumerate(zip(rewards, lengths, strict=True))]


def test_queue_actor_shapes_then_filters_within_its_budget():
    async def scenario():
        s = DapoShaping(filter_groups=True, filter_budget=1, overlong=True, max_tokens=8, overlong_buffer=4)
        q = QueueService(minibatch_groups=1, version_groups=1, max_lag=3, group_size=2, shaping=s)
        assert await q.admit(["a", "b", "c", "d"], 0)
        await q.put_group(_group("a", [1.0, 1.0], [2, 2]))  # equal: filtered (budget 1)
        await q.put_group(_group("b", [1.0, 1.0], [2, 8]))  # the long one loses 1.0: learnable
        await q.put_group(_group("c", [0.0, 0.0], [3, 3]))  # equal, but the budget is spent: trained
        arrivals, _, _ = await q.wait_arrivals(0, 0.0)
        assert [r.filtered for r in arrivals] == [True, False, False]
        state = await q.state()
        assert state["filtered"] == 1 and state["queued"] == 2 and state["in_flight"] == 1
        mb = await q.get_batch(0.0)
        assert mb.groups == ("b",) and [t.reward for t in mb.trajectories] == [1.0, 0.0]
        snap = await q.snapshot()
        assert snap["filtered_ids"] == ["a"] and "a" not in snap["consumed_ids"]
        q2 = QueueService(minibatch_groups=1, version_groups=1, max_lag=3, group_size=2, shaping=s)
        await q2.restore(snap["consumed"], snap["consumed_ids"], snap["queued"], snap["filtered_ids"])
        assert (await q2.state())["filtered"] == 1 and q2.filtered_ids == ["a"]

    asyncio.run(scenario())


def test_equal_rewards_after_shaping_decide():
    """Filtering looks at the final (shaped) reward: equal raw rewards with different lengths differ."""
    assert equal_rewards([1.0, 1.0])
    assert not equal_rewards([1.0, 0.5])
