"""The feed: which planned unit an instance asking for work gets next (static / pull / stream dispatch).

One strategy object per run, chosen once from the mode table (`make_feed`); the simulator and the
Ray controller drive the same objects. A feed holds the units of every planned window not yet taken;
the oldest window goes first. The driver asks `peek(i)` for instance i's next unit, `take`s it when it
starts it, tells the feed `refused` when admission withheld a peeked unit and `done` when a group
finished; when `peek` answers None the driver plans the next window (`add`) and asks again.

- `StaticFeed`: each instance its own ordered list (the ASP plan, or a dealt synchronous batch); with
  `steal`, an instance whose list is empty in the oldest window takes the last (shortest-planned) unit
  of the instance with the most left there -- units not yet sent, never running ones.
- `PullFeed`: one global FIFO, taken by whichever instance asks.
- `StreamFeed`: one global list of single groups; `schedule.dispatch.StreamDispatcher` picks, for the
  asking instance, among the oldest window's groups (predicted-long groups spread by in-flight load).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

from asp_npu.core.records import Unit
from asp_npu.schedule.dispatch import StreamDispatcher


class Feed:
    """Units planned and not yet taken, per window (the base keeps the windows; subclasses pick)."""

    def __init__(self, instances: int) -> None:
        self.instances = instances
        self.windows: dict[int, list[deque[Unit]]] = {}

    def _lanes(self, units: list[Unit]) -> list[deque[Unit]]:
        return [deque(units)]

    def add(self, units: list[Unit]) -> None:
        """One planned window's units (all of the same window), in dispatch order."""
        if units:
            self.windows[units[0].window] = self._lanes(units)

    def peek(self, i: int) -> Unit | None:
        """Instance i's next unit, or None when no planned window holds one for it."""
        for w in sorted(self.windows):
            u = self._pick(self.windows[w], i)
            if u is not None:
                return u
        return None

    def _pick(self, lanes: list[deque[Unit]], i: int) -> Unit | None:
        return lanes[0][0]

    def take(self, unit: Unit) -> None:
        """`unit` (from `peek`) starts: remove it."""
        lanes = self.windows[unit.window]
        for q in lanes:
            if q and q[0] is unit:
                q.popleft()
                break
            if q and q[-1] is unit:
                q.pop()
                break
        else:
            for q in lanes:
                if unit in q:
                    q.remove(unit)
                    break
        if not any(lanes):
            del self.windows[unit.window]

    def refused(self, unit: Unit) -> None:
        """Admission withheld a peeked unit (it stays pending)."""

    def done(self, group: Hashable) -> None:
        """A group finished."""

    def pending(self) -> int:
        return sum(len(q) for lanes in self.windows.values() for q in lanes)


class StaticFeed(Feed):
    def __init__(self, instances: int, steal: bool = False) -> None:
        super().__init__(instances)
        self.steal = steal

    def _lanes(self, units: list[Unit]) -> list[deque[Unit]]:
        lanes: list[deque[Unit]] = [deque() for _ in range(self.instances)]
        for u in units:
            lanes[u.instance].append(u)
        return lanes

    def peek(self, i: int) -> Unit | None:
        for w in sorted(self.windows):
            lanes = self.windows[w]
            if lanes[i]:
                return lanes[i][0]
            if self.steal:
                k = max(range(len(lanes)), key=lambda j: len(lanes[j]))
                return lanes[k][-1]
        return None


class PullFeed(Feed):
    pass


class StreamFeed(Feed):
    def __init__(self, instances: int, slice_groups: int) -> None:
        super().__init__(instances)
        self.dispatcher = StreamDispatcher(instances, slice_groups=slice_groups)

    def add(self, units: list[Unit]) -> None:
        self.dispatcher.add([u.groups[0] for u in units], [u.q90 for u in units])
        super().add(units)

    def _pick(self, lanes: list[deque[Unit]], i: int) -> Unit | None:
        q = lanes[0]
        return q[self.dispatcher.choose([u.groups[0] for u in q], i)]

    def refused(self, unit: Unit) -> None:
        self.dispatcher.unplace(unit.groups[0])

    def done(self, group: Hashable) -> None:
        self.dispatcher.done(group)


def make_feed(dispatch: str, instances: int, version_groups: int, steal: bool = False) -> Feed:
    """The mode's feed; `version_groups` is the stream dispatcher's admission slice."""
    if dispatch == "static":
        return StaticFeed(instances, steal)
    if dispatch == "stream":
        return StreamFeed(instances, version_groups)
    if dispatch == "pull":
        return PullFeed(instances)
    raise ValueError(f"unknown dispatch '{dispatch}'")
