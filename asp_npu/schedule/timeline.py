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


def timeline(
    instance_units: list[list[int]],
    seconds: np.ndarray,
    sizes: np.ndarray,
    minibatch: int,
    max_lag: int,
    train_step_s: float,
    last_unit: int = -1,
) -> Timeline:
    M, L, T = minibatch, max_lag, train_step_s
    # a NaN or inf time never orders in the event heap: the loop below would never end
    if not (np.all(np.isfinite(seconds)) and np.all(seconds >= 0) and math.isfinite(T) and T >= 0):
        raise ValueError("timeline needs finite, non-negative unit seconds and train_step_s")
    if M < 1 or L < 0:
        raise ValueError(f"timeline needs minibatch >= 1 and max_lag >= 0 (got {M}, {L})")
    u_count = int(seconds.size)
    total = int(sizes.sum())
    sec, sz = seconds.tolist(), sizes.tolist()
    start = np.zeros(u_count)
    finish = np.zeros(u_count)
    version = np.zeros(u_count, dtype=np.int64)
    target = np.full(u_count, -1, dtype=np.int64)
    remaining = list(sz)
    step_end: list[float] = []

    events: list[tuple[float, int, int, int]] = []  # (time, kind, seq, payload)
    seq = 0

    def push(t: float, kind: int, payload: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, kind, seq, payload))

    pos = [0] * len(instance_units)
    inst_of = [0] * u_count
    for k, units in enumerate(instance_units):
        for u in units:
            inst_of[u] = k
    waiting: list[int] = []  # instances ready but not admitted, ascending
    wait_since: dict[int, float] = {}
    for k, units in enumerate(instance_units):
        if units:
            waiting.append(k)
            wait_since[k] = 0.0
    admitted = started = consumed = 0
    v = 0  # steps ended
    trainer_busy = False
    trainer_free_at = 0.0
    trainer_idle = 0.0
    wait_total = 0.0
    outstanding: dict[int, int] = {}  # deadline -> samples admitted, not yet consumed
    deadlines: list[int] = []  # sorted keys of `outstanding`
    pool: list[tuple[int, float, int]] = []  # (deadline, finish, unit) completed, not fully consumed
    pool_samples = 0

    def try_trainer(t: float) -> None:
        nonlocal trainer_busy, consumed, pool_samples, trainer_idle
        if trainer_busy or consumed >= total:
            return
        s = len(step_end)  # the step about to run
        need = min(M, total - consumed)
        if pool_samples < need:
            return
        # take `need` samples earliest-deadline first, then check Hall's condition: for every deadline
        # d, what stays outstanding with deadline <= d must fit in the positions before (d+1)*M
        popped: list[tuple[int, float, int]] = []
        taken: dict[int, int] = {}
        rest = need
        while rest:
            item = heapq.heappop(pool)
            popped.append(item)
            k = min(rest, remaining[item[2]])
            taken[item[0]] = taken.get(item[0], 0) + k
            rest -= k
        after = consumed + need
        # only deadlines below the take's last one can fail: for d >= it the condition is the one the
        # admission rule already keeps (admitted <= (max_lag + v + 1) * M), shifted by `need`
        last_d = popped[-1][0]
        acc = 0
        for d in deadlines:
            if d >= last_d:
                break
            acc += outstanding[d] - taken.get(d, 0)
            if acc > (d + 1) * M - after:
                for item in popped:  # wait: a straggler due by step d must be in an earlier handout
                    heapq.heappush(pool, item)
                return
        take = need
        for d, f, u in popped:
            k = min(take, remaining[u])
            remaining[u] -= k
            take -= k
            outstanding[d] -= k
            if outstanding[d] == 0:
                del outstanding[d]
                deadlines.pop(bisect_left(deadlines, d))
            if remaining[u] == 0:
                target[u] = s
            else:
                heapq.heappush(pool, (d, f, u))
        consumed += need
        pool_samples -= need
        trainer_idle += t - trainer_free_at
        trainer_busy = True
        push(t + T, _STEP_END, s)

    def try_admit(t: float) -> None:
        nonlocal admitted, started, wait_total
        still: list[int] = []
        for k in waiting:
            u = instance_units[k][pos[k]]
            ok = admitted + sz[u] <= (L + v + 1) * M and (u != last_unit or started == u_count - 1)
            if not ok:
                still.append(k)
                continue
            wait_total += t - wait_since.pop(k)
            start[u], finish[u], version[u] = t, t + sec[u], v
            admitted += sz[u]
            started += 1
            if v + L not in outstanding:
                outstanding[v + L] = 0
                insort(deadlines, v + L)
            outstanding[v + L] += sz[u]
            push(t + sec[u], _FINISH, u)
        waiting[:] = still

    try_admit(0.0)
    while events or waiting:
        if not events:
            raise LagDeadlock(f"{len(waiting)} instances blocked with {admitted}/{total} samples admitted")
        t = events[0][0]
        while events and events[0][0] == t:
            _, kind, _, payload = heapq.heappop(events)
            if kind == _FINISH:
                u = payload
                d = int(version[u]) + L
                heapq.heappush(pool, (d, t, u))
                pool_samples += sz[u]
                k = inst_of[u]
                pos[k] += 1
                if pos[k] < len(instance_units[k]):
                    waiting.append(k)
                    waiting.sort()
                    wait_since[k] = t
            elif kind == _STEP_END:
                step_end.append(t)
                v = len(step_end)
                trainer_busy = False
                trainer_free_at = t
        try_trainer(t)
        try_admit(t)
        try_trainer(t)
    if consumed < total or np.any(target < 0):
        raise LagDeadlock(f"trainer consumed {consumed}/{total} samples")
    return Timeline(start, finish, version, target, np.asarray(step_end), wait_total, trainer_idle)
