"""The planned timeline: instances run their ordered units under the bounded-lag rule, a trainer consumes.

This is the model in which a plan is "predicted" (start/finish per unit, trainer steps) and in which
"respects the lag bound" is defined (package docstring), consistent with the pipeline's TrainQueue
(`asp_npu.core.staleness`):

- admission: a unit of n samples may start at time t only if `admitted + n <= (max_lag + v + 1) * M`,
  v = trainer steps ended by t (the weights version; refresh is immediate); the remainder unit (the
  one smaller unit, if any) only once every other unit has started;
- trainer: step s starts when the trainer is free and `min(M, N - consumed)` completed samples are
  waiting; it takes them earliest-deadline first (deadline = version + max_lag; then completion
  order) and lasts `train_step_s`. It waits instead while that take would leave, for some deadline d,
  more samples due by step d than positions before `(d + 1) * M` (Hall's condition, as the pipeline's
  ledger: a straggler due soon must be in an earlier handout).

So every sample is consumed by a step s with `s - version <= max_lag` (checked, never assumed:
`check_lag_bound`).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from dataclasses import dataclass

import numpy as np

_FINISH, _STEP_END = 0, 1  # event kinds, processed in this order at equal times


@dataclass
class Timeline:
    start: np.ndarray  # (u,) planned start
    finish: np.ndarray  # (u,)
    version: np.ndarray  # (u,) weights version at start
    target_step: np.ndarray  # (u,) trainer step that consumes the unit's last sample
    step_end: np.ndarray  # (steps,) planned trainer step end times
    admission_wait_s: float  # instance-seconds waiting for admission (lag rule / remainder last)
    trainer_idle_s: float  # trainer seconds between steps (waiting for a minibatch or a straggler)


class LagDeadlock(RuntimeError):
    """The timeline cannot progress (a planner bug: units are sized so this cannot happen)."""


class _Run:
    """The state of one planned timeline; `timeline()` drives it through its events."""

    def __init__(self, instance_units: list[list[int]], seconds: np.ndarray, sizes: np.ndarray,
                 minibatch: int, max_lag: int, train_step_s: float, last_unit: int) -> None:
        self.units, self.last_unit = instance_units, last_unit
        self.M, self.L, self.T = minibatch, max_lag, train_step_s
        self.u_count = int(seconds.size)
        self.total = int(sizes.sum())
        self.sec, self.sz = seconds.tolist(), sizes.tolist()
        self.start = np.zeros(self.u_count)
        self.finish = np.zeros(self.u_count)
        self.version = np.zeros(self.u_count, dtype=np.int64)
        self.target = np.full(self.u_count, -1, dtype=np.int64)
        self.remaining = list(self.sz)
        self.step_end: list[float] = []
        self.events: list[tuple[float, int, int, int]] = []  # (time, kind, seq, payload)
        self.seq = 0
        self.pos = [0] * len(instance_units)
        self.inst_of = [0] * self.u_count
        for k, units in enumerate(instance_units):
            for u in units:
                self.inst_of[u] = k
        self.waiting = [k for k, units in enumerate(instance_units) if units]  # ready, not admitted
        self.wait_since = dict.fromkeys(self.waiting, 0.0)
        self.admitted = self.started = self.consumed = 0
        self.v = 0  # steps ended
        self.trainer_busy = False
        self.trainer_free_at = 0.0
        self.trainer_idle = 0.0
        self.wait_total = 0.0
        self.outstanding: dict[int, int] = {}  # deadline -> samples admitted, not yet consumed
        self.deadlines: list[int] = []  # sorted keys of `outstanding`
        self.pool: list[tuple[int, float, int]] = []  # (deadline, finish, unit) completed, not fully consumed
        self.pool_samples = 0

    def push(self, t: float, kind: int, payload: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, payload))

    def _take(self, need: int) -> tuple[list[tuple[int, float, int]], dict[int, int]]:
        """Pop `need` samples' worth of completed units earliest-deadline first."""
        popped: list[tuple[int, float, int]] = []
        taken: dict[int, int] = {}
        rest = need
        while rest:
            item = heapq.heappop(self.pool)
            popped.append(item)
            k = min(rest, self.remaining[item[2]])
            taken[item[0]] = taken.get(item[0], 0) + k
            rest -= k
        return popped, taken

    def _starves_a_deadline(self, popped: list[tuple[int, float, int]], taken: dict[int, int],
                            after: int) -> bool:
        """Hall's condition: for every deadline d, what stays outstanding with deadline <= d must fit in
        the positions before (d+1)*M. Only deadlines below the take's last one can fail: for d >= it
        the condition is the one the admission rule already keeps, shifted by the take."""
        last_d = popped[-1][0]
        acc = 0
        for d in self.deadlines:
            if d >= last_d:
                break
            acc += self.outstanding[d] - taken.get(d, 0)
            if acc > (d + 1) * self.M - after:
                return True
        return False

    def try_trainer(self, t: float) -> None:
        if self.trainer_busy or self.consumed >= self.total:
            return
        s = len(self.step_end)  # the step about to run
        need = min(self.M, self.total - self.consumed)
        if self.pool_samples < need:
            return
        popped, taken = self._take(need)
        if self._starves_a_deadline(popped, taken, self.consumed + need):
            for item in popped:  # wait: a straggler due by step d must be in an earlier handout
                heapq.heappush(self.pool, item)
            return
        take = need
        for d, f, u in popped:
            k = min(take, self.remaining[u])
            self.remaining[u] -= k
            take -= k
            self.outstanding[d] -= k
            if self.outstanding[d] == 0:
                del self.outstanding[d]
                self.deadlines.pop(bisect_left(self.deadlines, d))
            if self.remaining[u] == 0:
                self.target[u] = s
            else:
                heapq.heappush(self.pool, (d, f, u))
        self.consumed += need
        self.pool_samples -= need
        self.trainer_idle += t - self.trainer_free_at
        self.trainer_busy = True
        self.push(t + self.T, _STEP_END, s)

    def try_admit(self, t: float) -> None:
        still: list[int] = []
        for k in self.waiting:
            u = self.units[k][self.pos[k]]
            ok = (self.admitted + self.sz[u] <= (self.L + self.v + 1) * self.M
                  and (u != self.last_unit or self.started == self.u_count - 1))
            if not ok:
                still.append(k)
                continue
            self.wait_total += t - self.wait_since.pop(k)
            self.start[u], self.finish[u], self.version[u] = t, t + self.sec[u], self.v
            self.admitted += self.sz[u]
            self.started += 1
            d = self.v + self.L
            if d not in self.outstanding:
                self.outstanding[d] = 0
                insort(self.deadlines, d)
            self.outstanding[d] += self.sz[u]
            self.push(t + self.sec[u], _FINISH, u)
        self.waiting[:] = still

    def on_event(self, t: float, kind: int, payload: int) -> None:
        if kind == _FINISH:
            u = payload
            heapq.heappush(self.pool, (int(self.version[u]) + self.L, t, u))
            self.pool_samples += self.sz[u]
            k = self.inst_of[u]
            self.pos[k] += 1
            if self.pos[k] < len(self.units[k]):
                self.waiting.append(k)
                self.waiting.sort()
                self.wait_since[k] = t
        elif kind == _STEP_END:
            self.step_end.append(t)
            self.v = len(self.step_end)
            self.trainer_busy = False
            self.trainer_free_at = t


def timeline(
    instance_units: list[list[int]],
    seconds: np.ndarray,
    sizes: np.ndarray,
    minibatch: int,
    max_lag: int,
    train_step_s: float,
    last_unit: int = -1,
) -> Timeline:
    # a NaN or inf time never orders in the event heap: the loop below would never end
    if not (np.all(np.isfinite(seconds)) and np.all(seconds >= 0) and math.isfinite(train_step_s)
            and train_step_s >= 0):
        raise ValueError("timeline needs finite, non-negative unit seconds and train_step_s")
    if minibatch < 1 or max_lag < 0:
        raise ValueError(f"timeline needs minibatch >= 1 and max_lag >= 0 (got {minibatch}, {max_lag})")
    r = _Run(instance_units, seconds, sizes, minibatch, max_lag, train_step_s, last_unit)
    r.try_admit(0.0)
    while r.events or r.waiting:
        if not r.events:
            raise LagDeadlock(f"{len(r.waiting)} instances blocked with {r.admitted}/{r.total} samples "
                              "admitted")
        t = r.events[0][0]
        while r.events and r.events[0][0] == t:
            _, kind, _, payload = heapq.heappop(r.events)
            r.on_event(t, kind, payload)
        r.try_trainer(t)
        r.try_admit(t)
        r.try_trainer(t)
    if r.consumed < r.total or np.any(r.target < 0):
        raise LagDeadlock(f"trainer consumed {r.consumed}/{r.total} samples")
    return Timeline(r.start, r.finish, r.version, r.target, np.asarray(r.step_end), r.wait_total,
                    r.trainer_idle)
