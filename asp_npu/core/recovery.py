"""Failure policy of the real pipeline, without Ray: retries of failed requests and hung instances.

A group whose request failed on an instance is generated again, on any live instance, at most
`max_retries` times; after that it is given up (counted, reported, and the run stops with one line
naming it: the lag ledger of the TrainQueue counts every planned group, so a run cannot train around
it). An instance is hung when it holds work and delivered nothing for `timeout_s` seconds; the
driver then treats it as lost (`DispatchPolicy.lost`), exactly like an instance whose actor died.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass
class Retries:
    """How often each group's request failed; whether it gets another try."""

    max_retries: int
    failures: dict[Hashable, int] = field(default_factory=dict)
    given_up: dict[Hashable, str] = field(default_factory=dict)  # group -> its last error

    def failed(self, group: Hashable, error: str) -> bool:
        """Record one failure of `group`'s request; True if it is to be generated again."""
        n = self.failures[group] = self.failures.get(group, 0) + 1
        if n > self.max_retries:
            self.given_up[group] = error
            return False
        return True

    @property
    def retried(self) -> int:
        return sum(min(n, self.max_retries) for n in self.failures.values())


@dataclass
class Watchdog:
    """Last progress per instance: a delivered group, or the moment it got work while idle."""

    instances: int
    timeout_s: float
    since: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.since = [float("nan")] * self.instances  # not watched yet: the first look starts the clock

    def progressed(self, i: int, now: float) -> None:
        self.since[i] = now

    def hung(self, busy: list[bool], now: float) -> list[int]:
        """Instances with work that made no progress for `timeout_s` (idle ones are never hung)."""
        self.since = [now if math.isnan(s) else s for s in self.since]
        return [i for i in range(self.instances) if busy[i] and now - self.since[i] > self.timeout_s]
