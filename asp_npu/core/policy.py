"""The dispatch and admission policy of the real pipeline, without Ray: who starts which unit when.

Each round the least-loaded instance (fewest outstanding samples) with room asks the feed for its next
unit; the unit is admitted whole by the TrainQueue at the weights version that instance holds, or
withheld (the instance is `blocked`: back-pressure of the lag bound, never a discard). Room: under unit
admission the running unit plus `lookahead_units` queued; under continuous admission a backlog of two
batches of slots (a colocated mode hands its instances the whole window). When the feed has nothing
for an instance, the driver may plan the next window (`plan_next`) and the instance asks again.

The driver injects its side effects (`Ports`): the Ray controller's queue actor and instances, or plain
functions in tests.

Failures: `lost(i)` takes a dead (or hung) instance out of dispatch and returns its groups not yet
delivered; the driver cancels them in the TrainQueue and hands the cancelled ones to `redispatch`,
which makes them new units served before the feed to any live instance (each group exactly once:
a group arrives once, and one that arrived meanwhile is not cancelled, so not sent again); `back(i)`
lets the restarted instance take work again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from asp_npu.core.feed import Feed
from asp_npu.core.modes import Mode
from asp_npu.core.records import Unit

RETRY_UID = 1 << 40  # uids of re-dispatched units (the planner counts from 0)


@dataclass
class Ports:
    """What dispatching does to the world."""

    admit: Callable[[Unit, int], bool]  # admit the unit for instance i (all of its groups or none)
    submit: Callable[[int, Unit], None]  # send the admitted unit to instance i
    blocked: Callable[[int, bool], None]  # instance i is (not) withheld by admission
    plan_next: Callable[[], bool] = lambda: False  # plan another window; False when none is left


@dataclass
class DispatchPolicy:
    feed: Feed
    mode: Mode
    instances: int
    slots: int
    units: dict[int, Unit] = field(default_factory=dict)  # every planned unit by uid
    group_unit: dict[Hashable, int] = field(default_factory=dict)
    submitted_to: dict[int, int] = field(default_factory=dict)
    done_groups: dict[int, int] = field(default_factory=dict)
    inflight: list[set[int]] = field(default_factory=list)
    arrived_groups: set[Hashable] = field(default_factory=set)
    down: set[int] = field(default_factory=set)  # lost instances, not taking work until `back`
    retry: deque[Unit] = field(default_factory=deque)  # re-dispatched groups, served before the feed
    next_retry_uid: int = RETRY_UID

    def __post_init__(self) -> None:
        self.inflight = [set() for _ in range(self.instances)]

    # ------------------------------------------------------------------ failures
    def lost(self, i: int) -> list[Hashable]:
        """Instance i is gone: it takes no work until `back(i)`; returns its groups not delivered."""
        self.down.add(i)
        missing = [g for uid in sorted(self.inflight[i]) for g in self.units[uid].groups
                   if g not in self.arrived_groups and self.group_unit[g] == uid]
        self.inflight[i] = set()
        return missing

    def redispatch(self, groups: list[Hashable]) -> list[Unit]:
        """New units (one per group) for groups cancelled in the queue, served before the feed."""
        out = []
        for g in groups:
            old = self.units[self.group_unit[g]]
            u = Unit(self.next_retry_uid, old.window, (g,), old.group_size)
            self.next_retry_uid += 1
            self.units[u.uid] = u
            self.group_unit[g] = u.uid
            self.retry.append(u)
            out.append(u)
            self._settle(old)
        return out

    def _settle(self, unit: Unit) -> None:
        """A unit leaves its instance's in-flight set once each of its groups arrived or moved away."""
        if unit.uid in self.submitted_to and all(
                g in self.arrived_groups or self.group_unit[g] != unit.uid for g in unit.groups):
            self.inflight[self.submitted_to[unit.uid]].discard(unit.uid)

    def back(self, i: int) -> None:
        self.down.discard(i)

    def busy(self) -> list[bool]:
        return [bool(s) for s in self.inflight]

    def _next(self, i: int, ports: Ports) -> tuple[Unit | None, bool]:
        """Instance i's next unit and whether it is a retry."""
        if self.retry:
            return self.retry[0], True
        unit = self.feed.peek(i)
        if unit is None and ports.plan_next():
            unit = self.feed.peek(i)
        return unit, False

    def add_window(self, units: list[Unit]) -> None:
        for u in units:
            self.units[u.uid] = u
            for g in u.groups:
                self.group_unit[g] = u.uid
        self.feed.add(units)

    def outstanding(self, i: int) -> int:
        """Samples submitted to instance i and not yet delivered."""
        return sum(self.units[u].num_samples - self.done_groups.get(u, 0) * self.units[u].group_size
                   for u in self.inflight[i])

    def room(self, i: int) -> bool:
        if i in self.down:
            return False
        if self.mode.admission == "unit":
            return len(self.inflight[i]) <= self.mode.lookahead_units
        return self.mode.colocated or self.outstanding(i) < 2 * self.slots

    def dispatch(self, ports: Ports) -> list[tuple[int, Unit]]:
        """Submit admitted units, least-loaded instance first, up to each instance's room; returns them."""
        sent: list[tuple[int, Unit]] = []
        done: set[int] = set()
        while True:
            for i in range(self.instances):
                if i not in done and not self.room(i):
                    ports.blocked(i, False)
                    done.add(i)
            cands = [i for i in range(self.instances) if i not in done]
            if not cands:
                return sent
            i = min(cands, key=lambda j: (self.outstanding(j), j))
            unit, is_retry = self._next(i, ports)
            if unit is None:
                ports.blocked(i, False)
                done.add(i)
            elif not ports.admit(unit, i):
                if not is_retry:
                    self.feed.refused(unit)
                ports.blocked(i, not self.inflight[i])
                done.add(i)
            else:
                ports.blocked(i, False)
                if is_retry:
                    self.retry.popleft()
                else:
                    self.feed.take(unit)
                self.submitted_to[unit.uid] = i
                ports.submit(i, unit)
                self.inflight[i].add(unit.uid)
                sent.append((i, unit))

    def arrived(self, group: Hashable) -> Unit:
        """A group finished: its unit leaves its instance's in-flight set once all its groups are back."""
        if group in self.arrived_groups:
            raise ValueError(f"group {group!r} arrived twice")
        self.arrived_groups.add(group)
        uid = self.group_unit[group]
        self.feed.done(group)
        self.done_groups[uid] = self.done_groups.get(uid, 0) + 1
        unit = self.units[uid]
        self._settle(unit)
        return unit

    def planned_samples(self) -> int:
        return sum(self.units[uid].group_size for uid in self.group_unit.values())  # retries not twice
