"""The TrainQueue as a Ray actor: rollout instances put finished groups, the controller admits and takes.

A thin wrapper on the wall clock around `asp_npu.core.train_queue.TrainQueue` (the exact class
the simulator drives on its virtual clock), so admission, the lag ledger and the occupancy/lag
metrics are the same code in both. What the wrapper adds is only what crossing processes needs:
whole units admitted all-or-none, groups assembled from `list[Trajectory]` (the sink protocol of
`RolloutInstance`), a waitable `get_batch`, and an arrivals log the controller polls for progress.

Group ids are the instance-level prompt ids (`str(GroupKey)`: `<prompt_id>@<epoch>`), unique within a
run. Messages to the driver are `asp_npu.core.records.Arrival` and `Minibatch`. The actor keeps the
ledger of consumed group ids (handout order); `snapshot`/`restore` carry it and the queued groups
(payloads: trajectories with versions and behaviour logprobs) across a checkpoint.

DAPO (`asp_npu.data.shaping`): a put group's rewards get the overlong penalty first; then, with dynamic
sampling, a group whose filter metric (`rl_config.filter_groups_metric`) is all equal is discarded
(consumed without training, its id in the `filtered_ids` ledger, its arrival marked `filtered`) while
the run's filter budget lasts, so the controller plans replacement prompts and every minibatch stays
whole.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from asp_npu.core.records import Arrival, Minibatch
from asp_npu.core.staleness import reconcile_stamp
from asp_npu.core.train_queue import QueuedGroup, TrainQueue
from asp_npu.data.shaping import DapoShaping, equal_rewards, filter_values, shaped_rewards
from asp_npu.types import Trajectory

WARMUP_PREFIX = "__warmup__"


class QueueService:
    """Async Ray actor body (`ray.remote(QueueService)`); usable in-process in tests."""

    def __init__(
        self, minibatch_groups: int, version_groups: int, max_lag: int, group_size: int, order: str = "fifo",
        steps_per_version: int = 1, max_token_lag: int | None = None, shaping: DapoShaping | None = None,
    ) -> None:
        self.shaping = shaping or DapoShaping()
        self.filtered_ids: list[str] = []  # groups discarded by dynamic sampling, in arrival order
        self.queue = TrainQueue(minibatch_groups, version_groups, max_lag, order=order, clock=time.time,
                                max_token_lag=max_token_lag)
        self.group_size = group_size
        self.steps_per_version = steps_per_version
        self.base = 0  # trainer step a resumed run continued after (ledger versions count from it)
        self.restamps = {"waiting": 0, "running": 0, "at_put": 0}  # groups restamped, by cause
        self.arrivals: list[Arrival] = []  # one per put group, in arrival order
        self.handouts: list[dict[str, Any]] = []
        self.consumed_ids: list[str] = []  # every group handed to the trainer, in order (resumed ones first)
        self.owner: dict[str, int] = {}  # admitted group -> the instance generating it
        self.failures: list[tuple[str, int, str]] = []  # (group, instance, error) of failed requests
        self.stale_puts = 0  # groups put by an instance that no longer owns them (it was declared lost)
        self._changed: asyncio.Event | None = None
        self.wakes = 0

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _notify(self) -> None:
        """Wake every waiter: set the current event and start a new one (nobody clears an event another
        waiter still needs)."""
        self._event().set()
        self._changed = asyncio.Event()

    async def wake(self) -> int:
        """Wake the controller's `wait_arrivals` (e.g. a trainer step finished); returns the wake count."""
        self.wakes += 1
        self._notify()
        return self.wakes

    async def set_base(self, base: int) -> None:
        self.base = int(base)

    def ledger_version(self, weights_step: int) -> int:
        """The ledger's version of weights published after `weights_step` trainer steps."""
        return (int(weights_step) - self.base) // self.steps_per_version

    async def restamp(self, instance: int, weights_step: int, waiting: list[str], running: list[str]) -> None:
        """Weights `weights_step` went live on `instance`: its `waiting` groups (no token yet) start with
        them; under partial rollout its `running` ones count their newest tokens from them."""
        v = self.ledger_version(weights_step)
        partial = self.queue.max_token_lag is not None
        for gids, started in ((waiting, False), (running if partial else [], True)):
            for gid in gids:
                st = self.queue.stamp(gid) if self.owner.get(gid) == instance else None
                if st is not None and v > st[1]:
                    self.queue.restamp(gid, v, started=started)
                    self.restamps["running" if started else "waiting"] += 1

    def _reconcile(self, gid: str, group: list[Trajectory]) -> None:
        """Bring the stamp to the versions the group's tokens were recorded with (`reconcile_stamp`)."""
        st = self.queue.stamp(gid)
        if st is None:
            return
        rec = (self.ledger_version(min(t.changes()[0][1] for t in group)),
               self.ledger_version(max(t.changes()[-1][1] for t in group)))
        for v, started in reconcile_stamp(st, rec, self.queue.max_token_lag is not None):
            self.queue.restamp(gid, v, started=started)
            self.restamps["at_put"] += 1

    async def capacity(self, version: int) -> int:
        return self.queue.capacity(version)

    async def admit(self, group_ids: list[str], version: int, instance: int = -1) -> bool:
        """Admit all of `group_ids` at weights `version` for `instance`, or none of them (a unit starts
        whole)."""
        if self.queue.capacity(version) < len(group_ids):
            return False
        now = time.time()
        for gid in group_ids:
            self.queue.admit(gid, version, now)
            self.owner[gid] = instance
        return True

    async def cancel(self, group_ids: list[str]) -> list[str]:
        """Free the ledger places of admitted groups that will not arrive (their instance was lost or
        their request failed); returns those cancelled -- a group already put is not, it arrived."""
        now = time.time()
        out = []
        for gid in group_ids:
            if gid in self.owner:
                self.queue.cancel(gid, now)
                del self.owner[gid]
                out.append(gid)
        self._notify()
        return out

    async def group_failed(self, gid: str, instance: int, error: str) -> None:
        """Sink protocol: the request of group `gid` failed on `instance` (the driver retries it)."""
        if self.owner.get(gid) == instance:
            self.failures.append((gid, instance, error))
            self._notify()

    async def put_group(self, group: list[Trajectory]) -> int:
        """Sink protocol of RolloutInstance: one finished GRPO group (all its samples)."""
        t = group[0]
        gid = t.prompt_id
        if gid.startswith(WARMUP_PREFIX):  # engine warm-up before the run's clock starts
            return len(self.arrivals)
        if gid not in self.owner or self.owner[gid] not in (-1, t.instance):
            self.stale_puts += 1  # a lost instance's late put: the group was cancelled or re-dispatched
            return len(self.arrivals)
        del self.owner[gid]
        self._reconcile(gid, group)
        tokens = sum(x.response_len for x in group)
        filtered = self._shape(group)
        if filtered:
            self.queue.discard(gid)
            self.filtered_ids.append(gid)
        else:
            self.queue.put(gid, samples=len(group), tokens=tokens, payload=group)
        self.arrivals.append(Arrival(
            gid, time.time(), t.instance, len(group), tokens,
            tuple(sorted({x.policy_version for x in group})), tuple(x.response_len for x in group),
            len(t.prompt_token_ids), filtered,
            tuple(sum(x.loss_mask) if x.loss_mask else x.response_len for x in group),
            tuple(x.turns for x in group), tuple(x.tool_s for x in group)))
        self._notify()
        return len(self.arrivals)

    def _shape(self, group: list[Trajectory]) -> bool:
        """Add the overlong penalty to the group's rewards; True when dynamic sampling filters it (all
        values of `shaping.filter_metric` equal, within the run's filter budget)."""
        s = self.shaping
        unshaped = [x.reward for x in group]
        for x, r in zip(group, shaped_rewards(unshaped, [x.response_len for x in group], s), strict=True):
            x.reward = r
        if not s.filter_groups or (s.filter_budget is not None and self.queue.filtered >= s.filter_budget):
            return False
        shaped, scores = [x.reward for x in group], [x.scores for x in group]
        return equal_rewards(filter_values(s.filter_metric, shaped, unshaped, scores))

    async def get_batch(self, timeout: float = 0.0, take: int | None = None) -> Minibatch | None:
        """A complete minibatch of whole groups within the lag bound, waiting up to `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            queued_before = self.queue.n_queued
            h = self.queue.get(take=take)
            if h is not None:
                mb = Minibatch(h.step, h.t, tuple(g.group_id for g in h.groups), tuple(h.lags), queued_before,
                               [t for g in h.groups for t in g.payload])
                self.handouts.append(mb.row())
                self.consumed_ids += [str(g) for g in mb.groups]
                self._notify()
                return mb
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                await asyncio.wait_for(self._event().wait(), left)
            except TimeoutError:
                return None

    async def wait_arrivals(
        self, since: int, timeout: float, wakes_seen: int | None = None, failures_seen: int = 0
    ) -> tuple[list[Arrival], int, list[tuple[str, int, str]]]:
        """Arrivals after index `since`, waiting up to `timeout` seconds for at least one, a failed
        request after `failures_seen`, or a `wake()` after `wakes_seen`. Returns (the arrivals, the wake
        count, the new failures); the controller blocks here between events instead of polling."""
        def due() -> bool:
            return (len(self.arrivals) > since or len(self.failures) > failures_seen
                    or (wakes_seen is not None and self.wakes > wakes_seen))

        deadline = time.monotonic() + timeout
        while not due():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(self._event().wait(), left)
            except TimeoutError:
                break
        return self.arrivals[since:], self.wakes, self.failures[failures_seen:]

    async def snapshot(self) -> dict[str, Any]:
        """What a checkpoint carries: the consumed-id ledger and the queued groups (in handout order);
        groups in flight are not carried (a resumed run generates them again)."""
        consumed, queued = self.queue.snapshot()
        return {"consumed": consumed, "consumed_ids": list(self.consumed_ids), "queued": queued,
                "filtered_ids": list(self.filtered_ids)}

    async def restore(self, consumed: int, consumed_ids: list[str], queued: list[QueuedGroup],
                      filtered_ids: tuple[str, ...] | list[str] = ()) -> int:
        """Take a checkpoint's queue back (before any admission); returns the groups queued."""
        self.queue.restore(consumed, queued, time.time())
        self.consumed_ids = list(consumed_ids)
        self.filtered_ids = list(filtered_ids)
        self.queue.filtered = len(self.filtered_ids)
        self._notify()
        return self.queue.n_queued

    async def state(self) -> dict[str, Any]:
        q = self.queue
        return {"queued": q.n_queued, "in_flight": q.n_in_flight, "consumed": q.consumed,
                "filtered": q.filtered,
                "trainer_step": q.trainer_step, "arrivals": len(self.arrivals),
                "failures": len(self.failures), "stale_puts": self.stale_puts,
                "restamps": dict(self.restamps)}

    async def series(self) -> dict[str, Any]:
        """Occupancy over time (groups), lags of handed-out groups, handouts and the queue summary."""
        s = self.queue.stats
        return {"t": list(s.t), "queued": list(s.queued), "in_flight": list(s.in_flight),
                "lags": list(s.lags), "handouts": list(self.handouts), "arrivals": list(self.arrivals),
                "summary": {**self.queue.summary(),
                            **{f"restamped_{k}": float(n) for k, n in self.restamps.items()}}}


def make_queue_actor(
    minibatch_groups: int, version_groups: int, max_lag: int, group_size: int, order: str = "fifo",
    steps_per_version: int = 1, max_token_lag: int | None = None, shaping: DapoShaping | None = None,
) -> Any:
    """Start the queue actor (Ray must be initialised); it takes no CPU slot of the instances/trainer.
    It lives on the driver's node: a zero-CPU actor would otherwise go to any node of a joined cluster,
    and losing that node would lose the queue (ledger, queued groups) with it, where the run can only
    lose that node's instances; the driver's node going down ends the run anyway."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    cls = ray.remote(QueueService).options(num_cpus=0, max_concurrency=1000, scheduling_strategy=here)
    return cls.remote(minibatch_groups, version_groups, max_lag, group_size, order, steps_per_version,
                      max_token_lag, shaping)
