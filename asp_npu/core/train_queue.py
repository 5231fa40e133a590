"""TrainQueue: whole GRPO groups in, complete minibatches out, policy lag bounded by admission control.

Pure Python and clock-agnostic on purpose: the simulator drives it with a virtual clock, the real
pipeline wraps this exact class in a Ray actor with wall time. Every method takes `now` (or uses the
injected `clock`). The lag rule lives in `asp_npu.core.staleness`; this class keeps the ledger
(what is in flight, what is queued, what was consumed) and the metrics (occupancy and lag over time).

Life of a group: `capacity(version)` > 0 -> `admit(group, version)` (generation starts with weights
`version`) -> `put(group)` when all its samples finished -> handed out by `get()` inside a minibatch
of `minibatch_groups` whole groups, oldest deadline first. `cancel(group)` returns an admitted group
whose instance died (it may be admitted again later). `discard(group)` (DAPO dynamic sampling) takes a
finished group that carries no signal: it is consumed without training -- its ledger place is freed for
a replacement and it is never handed out; `filtered` counts them. `snapshot()`/`restore()` carry the
queued groups and the consumed count across a checkpoint (groups still in flight are not carried: they
are generated again).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from asp_npu.core.staleness import (
    group_deadline,
    handout_feasible,
    handout_need,
    ledger_capacity,
    restamp_deadline,
    token_lags_ok,
)

ORDERS = ("fifo", "shortest")


@dataclass
class QueuedGroup:
    """One finished group waiting for the trainer (`version` = weights of its oldest token)."""

    group_id: Hashable
    version: int
    samples: int
    tokens: int
    t_admit: float
    t_put: float
    payload: Any = None
    oldest_version: int | None = None  # partial rollout: weights of its first token (None: = version)


@dataclass
class Handout:
    """A complete minibatch for trainer step `step` (all groups within the lag bound)."""

    step: int
    groups: list[QueuedGroup]
    t: float

    @property
    def lags(self) -> list[int]:
        return [self.step - g.version for g in self.groups]

    @property
    def samples(self) -> int:
        return sum(g.samples for g in self.groups)

    @property
    def tokens(self) -> int:
        return sum(g.tokens for g in self.groups)


@dataclass
class QueueStats:
    """Time series and counters for metrics (occupancy in groups)."""

    t: list[float] = field(default_factory=list)
    queued: list[int] = field(default_factory=list)
    in_flight: list[int] = field(default_factory=list)
    lags: list[int] = field(default_factory=list)
    refused_handouts: int = 0


class TrainQueue:
    """The bounded-lag queue between rollout instances and the trainer (see module docstring)."""

    def __init__(
        self,
        minibatch_groups: int,
        version_groups: int,
        max_lag: int,
        max_concurrent_groups: int | None = None,
        order: str = "fifo",
        clock: Callable[[], float] | None = None,
        max_token_lag: int | None = None,
    ) -> None:
        if minibatch_groups < 1 or version_groups < 1:
            raise ValueError("minibatch_groups and version_groups must be >= 1")
        if version_groups % minibatch_groups:
            raise ValueError(
                f"version_groups ({version_groups}) must be a multiple of "
                f"minibatch_groups ({minibatch_groups}) "
                "so that a minibatch never straddles a weight refresh"
            )
        if max_lag < 0:
            raise ValueError("max_lag must be >= 0")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}")
        if max_token_lag is not None and max_token_lag < max_lag:
            raise ValueError(f"max_token_lag ({max_token_lag}) must be >= max_lag ({max_lag})")
        self.max_token_lag = max_token_lag  # None: oldest-token rule; set: partial rollout
        self.minibatch_groups = minibatch_groups
        self.version_groups = version_groups
        self.max_lag = max_lag
        self.max_concurrent_groups = max_concurrent_groups
        self.order = order
        self._clock = clock or time.monotonic
        self.consumed = 0  # groups handed out so far
        self.filtered = 0  # finished groups discarded by dynamic sampling (never handed out)
        self._outstanding: dict[int, int] = {}  # deadline step -> admitted, not consumed
        self._in_flight: dict[Hashable, tuple[int, float]] = {}  # group -> (version, t_admit)
        self._oldest: dict[Hashable, int] = {}  # in-flight group -> oldest token's version (if older)
        self._queued: dict[int, list[tuple[Any, int, QueuedGroup]]] = {}  # deadline -> heap
        self._n_queued = 0
        self._seq = 0
        self.stats = QueueStats()

    # ----------------------------------------------------------------------------- properties
    @property
    def trainer_step(self) -> int:
        """The step the next handout belongs to (= weights version the trainer is producing)."""
        return self.consumed // self.version_groups

    @property
    def n_in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def n_queued(self) -> int:
        return self._n_queued

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now

    def _record(self, now: float) -> None:
        s = self.stats
        if s.t and s.t[-1] == now:
            s.queued[-1], s.in_flight[-1] = self._n_queued, len(self._in_flight)
        else:
            s.t.append(now)
            s.queued.append(self._n_queued)
            s.in_flight.append(len(self._in_flight))

    # ------------------------------------------------------------------------------ admission
    def capacity(self, version: int, now: float | None = None) -> int:
        """Groups generated with weights `version` that may be admitted now (never negative)."""
        cap = ledger_capacity(version, self.max_lag, self.version_groups, self.consumed, self._outstanding)
        if self.max_concurrent_groups is not None:
            cap = min(cap, self.max_concurrent_groups - len(self._in_flight))
        return max(0, cap)

    def admit(self, group_id: Hashable, version: int, now: float | None = None) -> None:
        """Start generating `group_id` with weights `version`; raises if that would break the bound."""
        now = self._now(now)
        if group_id in self._in_flight:
            raise ValueError(f"group {group_id!r} is already in flight")
        if self.capacity(version) < 1:
            raise RuntimeError(f"admission of group {group_id!r} at version {version} exceeds capacity")
        d = group_deadline(version, version, self.max_lag, self.max_token_lag)
        self._outstanding[d] = self._outstanding.get(d, 0) + 1
        self._in_flight[group_id] = (version, now)
        self._record(now)

    def _deadline(self, group_id: Hashable) -> int:
        version, _ = self._in_flight[group_id]
        oldest = self._oldest.get(group_id, version)
        return group_deadline(oldest, version, self.max_lag, self.max_token_lag)

    def restamp(
        self, group_id: Hashable, version: int, started: bool = True, now: float | None = None
    ) -> None:
        """Weights `version` reached in-flight `group_id` (`asp_npu.core.staleness.restamp_deadline`):
        a group with no token yet is stamped with it; under partial rollout a started one counts its
        newest tokens from it. Its deadline only moves later, so the ledger's guarantee still holds."""
        old_version, t_admit = self._in_flight[group_id]
        d_old = self._deadline(group_id)
        oldest, newest, d_new = restamp_deadline(
            self._oldest.get(group_id, old_version), old_version, version, started, self.max_lag,
            self.max_token_lag,
        )
        self._in_flight[group_id] = (newest, t_admit)
        if oldest < newest:
            self._oldest[group_id] = oldest
        else:
            self._oldest.pop(group_id, None)
        if d_new != d_old:
            self._drop_outstanding(d_old)
            self._outstanding[d_new] = self._outstanding.get(d_new, 0) + 1
        self._record(self._now(now))

    def stamp(self, group_id: Hashable) -> tuple[int, int] | None:
        """(oldest, newest) weights version an in-flight group is stamped with; None if not in flight."""
        if group_id not in self._in_flight:
            return None
        newest = self._in_flight[group_id][0]
        return self._oldest.get(group_id, newest), newest

    def cancel(self, group_id: Hashable, now: float | None = None) -> None:
        """An admitted group will not finish (its instance died): free its place in the ledger."""
        d = self._deadline(group_id)
        self._in_flight.pop(group_id)
        self._oldest.pop(group_id, None)
        self._drop_outstanding(d)
        self._record(self._now(now))

    def discard(self, group_id: Hashable, now: float | None = None) -> None:
        """An admitted group finished with no signal (DAPO dynamic sampling): consumed without training.

        It leaves the ledger as a cancelled one does (a replacement may take its place), but it is
        counted in `filtered` and must not be admitted again."""
        if group_id not in self._in_flight:
            raise KeyError(f"group {group_id!r} was not admitted (or was already put)")
        self.cancel(group_id, now)
        self.filtered += 1

    def _drop_outstanding(self, d: int) -> None:
        self._outstanding[d] -= 1
        if not self._outstanding[d]:
            del self._outstanding[d]

    # ----------------------------------------------------------------------------- completion
    def put(
        self, group_id: Hashable, samples: int, tokens: int = 0, now: float | None = None, payload: Any = None
    ) -> QueuedGroup:
        """All samples of an admitted group finished: queue it (whole) for the trainer."""
        now = self._now(now)
        if group_id not in self._in_flight:
            raise KeyError(f"group {group_id!r} was not admitted (or was already put)")
        d = self._deadline(group_id)
        version, t_admit = self._in_flight.pop(group_id)
        oldest = self._oldest.pop(group_id, None)
        g = QueuedGroup(group_id, version, samples, tokens, t_admit, now, payload, oldest)
        key = self._seq if self.order == "fifo" else (tokens, self._seq)
        heapq.heappush(self._queued.setdefault(d, []), (key, self._seq, g))
        self._seq += 1
        self._n_queued += 1
        self._record(now)
        return g

    # -------------------------------------------------------------------------------- handout
    def _pick(self, take: int) -> list[tuple[int, tuple[Any, int, QueuedGroup]]]:
        """The `take` queued groups with the earliest deadlines (ties: put order or fewest tokens)."""
        chosen: list[tuple[int, tuple[Any, int, QueuedGroup]]] = []
        for d in sorted(self._queued):
            for item in heapq.nsmallest(take - len(chosen), self._queued[d]):
                chosen.append((d, item))
            if len(chosen) == take:
                break
        return chosen

    def ready(self) -> bool:
        """A complete minibatch can be handed out now without breaking the lag bound."""
        return self._feasible() is not None

    def _feasible(self, take: int | None = None) -> list[tuple[int, tuple[Any, int, QueuedGroup]]] | None:
        take = self.minibatch_groups if take is None else take
        if take < 1 or self._n_queued < take:
            return None
        chosen = self._pick(take)
        need = handout_need(self.version_groups, self.consumed, take, self._outstanding)
        if not handout_feasible([d for d, _ in chosen], need):
            return None
        return chosen

    def get(self, now: float | None = None, take: int | None = None) -> Handout | None:
        """Hand out one minibatch of whole groups (oldest deadline first), or None: the trainer must wait.

        `take` (default `minibatch_groups`) lets the real pipeline flush a final short minibatch.
        """
        now = self._now(now)
        chosen = self._feasible(take)
        if chosen is None:
            if self._n_queued >= (take or self.minibatch_groups):
                self.stats.refused_handouts += 1
            return None
        step = self.trainer_step
        groups = []
        for d, item in chosen:
            self._queued[d].remove(item)
            heapq.heapify(self._queued[d])
            if not self._queued[d]:
                del self._queued[d]
            self._drop_outstanding(d)
            g = item[2]
            oldest = g.version if g.oldest_version is None else g.oldest_version
            if not token_lags_ok(step, oldest, g.version, self.max_lag, self.max_token_lag):
                raise AssertionError(  # the ledger makes this impossible
                    f"group {g.group_id!r}: versions {oldest}..{g.version} at step {step} "
                    "break the lag bounds"
                )
            groups.append(g)
            self.stats.lags.append(step - g.version)
        self._n_queued -= len(groups)
        self.consumed += len(groups)
        self._record(now)
        return Handout(step, groups, now)

    # ------------------------------------------------------------------------------ checkpoint
    def snapshot(self) -> tuple[int, list[QueuedGroup]]:
        """(groups consumed, the queued groups in handout order) -- what a checkpoint carries."""
        items = [(d, item) for d in sorted(self._queued) for item in sorted(self._queued[d])]
        return self.consumed, [g for _, (_, _, g) in items]

    def restore(self, consumed: int, groups: list[QueuedGroup], now: float | None = None) -> None:
        """An empty queue takes a snapshot back: the consumed count and the queued groups (with their
        versions, so deadlines and the lag ledger are the checkpointed run's)."""
        if self._in_flight or self._n_queued or self.consumed:
            raise RuntimeError("restore needs a fresh TrainQueue")
        self.consumed = consumed
        now = self._now(now)
        for g in groups:
            oldest = g.version if g.oldest_version is None else g.oldest_version
            d = group_deadline(oldest, g.version, self.max_lag, self.max_token_lag)
            self._outstanding[d] = self._outstanding.get(d, 0) + 1
            key = self._seq if self.order == "fifo" else (g.tokens, self._seq)
            heapq.heappush(self._queued.setdefault(d, []), (key, self._seq, g))
            self._seq += 1
            self._n_queued += 1
        self._record(now)

    def summary(self) -> dict[str, float]:
        """Queue metrics: lag mean/max, occupancy mean/max (time-weighted over the recorded span)."""
        s = self.stats
        out: dict[str, float] = {
            "lag_mean": sum(s.lags) / len(s.lags) if s.lags else 0.0,
            "lag_max": float(max(s.lags)) if s.lags else 0.0,
            "consumed_groups": float(self.consumed),
            "filtered_groups": float(self.filtered),
            "refused_handouts": float(s.refused_handouts),
        }
        if len(s.t) >= 2:
            span = s.t[-1] - s.t[0]
            tw_q = sum(q * (b - a) for q, a, b in zip(s.queued, s.t, s.t[1:], strict=False))
            tw_f = sum(q * (b - a) for q, a, b in zip(s.in_flight, s.t, s.t[1:], strict=False))
            out["queued_mean"] = tw_q / span if span > 0 else 0.0
            out["in_flight_mean"] = tw_f / span if span > 0 else 0.0
        else:
            out["queued_mean"] = out["in_flight_mean"] = 0.0
        out["queued_max"] = float(max(s.queued, default=0))
        out["in_flight_max"] = float(max(s.in_flight, default=0))
        return out
