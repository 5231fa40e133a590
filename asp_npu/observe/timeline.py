"""Chrome / Perfetto trace JSON from an `EventLog` (opens in ui.perfetto.dev or chrome://tracing).

Tracks: process "rollout" with one thread per instance (state spans: run / blocked / drained /
paused / lent, and a counter of running sequences), a thread per instance for dispatch units, process
"trainer" (busy / wait / paused / lent spans, weight versions as instant events) and a "queue"
counter (queued and in-flight groups). The simulator and the real pipeline share it.
"""

from __future__ import annotations

import os
from typing import Any

from asp_npu.io import atomic_write_json
from asp_npu.observe.events import EventLog

_ROLLOUT, _TRAINER, _QUEUE = 1, 2, 3


def _us(t: float) -> float:
    return round(t * 1e6, 3)


def _spans(points: list[tuple[float, str, Any]], t0: float, t1: float) -> list[tuple[float, float, str, Any]]:
    """Piecewise-constant (t, state, arg) points -> merged spans clipped to [t0, t1]."""
    out: list[tuple[float, float, str, Any]] = []
    for k, (t, state, arg) in enumerate(points):
        end = points[k + 1][0] if k + 1 < len(points) else t1
        a, b = max(t, t0), min(end, t1)
        if b <= a:
            continue
        if out and out[-1][2] == state and out[-1][1] == a:
            out[-1] = (out[-1][0], b, state, arg)
        else:
            out.append((a, b, state, arg))
    return out


def _instance_events(i: int, pts: list[tuple[float, str, int]], t0: float, t1: float) -> list[dict[str, Any]]:
    """Instance `i`'s two named threads, its state spans and its running-sequences counter."""
    ev: list[dict[str, Any]] = [
        {"ph": "M", "pid": _ROLLOUT, "tid": 2 * i, "name": "thread_name", "args": {"name": f"instance {i}"}},
        {"ph": "M", "pid": _ROLLOUT, "tid": 2 * i + 1, "name": "thread_name",
         "args": {"name": f"instance {i} units"}},
    ]
    ev += [
        {"ph": "X", "pid": _ROLLOUT, "tid": 2 * i, "name": state, "ts": _us(a - t0), "dur": _us(b - a)}
        for a, b, state, _ in _spans(pts, t0, t1)
    ]
    ev += [
        {"ph": "C", "pid": _ROLLOUT, "name": f"instance {i} running", "ts": _us(t - t0),
         "args": {"running": r}}
        for t, _, r in pts
        if t0 <= t <= t1
    ]
    return ev


def _unit_events(log: EventLog, t0: float, t1: float) -> list[dict[str, Any]]:
    """Each dispatch unit as a span on its instance's units thread, clipped to [t0, t1]."""
    return [
        {"ph": "X", "pid": _ROLLOUT, "tid": 2 * i + 1, "name": label, "ts": _us(max(a, t0) - t0),
         "dur": _us(min(b, t1) - max(a, t0)), "args": {"samples": n}}
        for i, label, a, b, n in log.units
        if b >= t0 and a <= t1
    ]


def _trainer_and_queue_events(log: EventLog, t0: float, t1: float) -> list[dict[str, Any]]:
    """The trainer's state spans, weight versions as instant events, and the queue counter."""
    tr = sorted(((t, s, u) for t, s, u in log.trainer), key=lambda e: e[0])
    ev: list[dict[str, Any]] = [
        {"ph": "X", "pid": _TRAINER, "tid": 0, "name": state, "ts": _us(a - t0), "dur": _us(b - a),
         "args": {"useful": round(float(useful), 4)}}
        for a, b, state, useful in _spans(tr, t0, t1)
    ]
    ev += [
        {"ph": "i", "pid": _TRAINER, "tid": 0, "s": "t", "name": f"weights v{v}", "ts": _us(t - t0)}
        for t, v in log.versions
        if t0 <= t <= t1
    ]
    ev += [
        {"ph": "C", "pid": _QUEUE, "name": "groups", "ts": _us(t - t0), "args": {"queued": q, "in_flight": f}}
        for t, q, f in log.queue_occ
        if t0 <= t <= t1
    ]
    return ev


def chrome_trace(log: EventLog, t0: float = 0.0, t1: float | None = None) -> dict[str, Any]:
    """The trace of [t0, t1] (seconds on the log's clock; the trace starts at 0)."""
    t1 = log.t_end if t1 is None else t1
    ev: list[dict[str, Any]] = [
        {"ph": "M", "pid": _ROLLOUT, "name": "process_name", "args": {"name": "rollout"}},
        {"ph": "M", "pid": _TRAINER, "name": "process_name", "args": {"name": "trainer"}},
        {"ph": "M", "pid": _QUEUE, "name": "process_name", "args": {"name": "train queue"}},
        {"ph": "M", "pid": _TRAINER, "tid": 0, "name": "thread_name", "args": {"name": "trainer"}},
    ]
    per_inst: dict[int, list[tuple[float, str, int]]] = {}
    for t, i, r, s in sorted(log.inst, key=lambda e: e[0]):
        per_inst.setdefault(i, []).append((t, s, r))
    for i in range(len(log.instance_devices)):
        ev += _instance_events(i, per_inst.get(i, []), t0, t1)
    ev += _unit_events(log, t0, t1) + _trainer_and_queue_events(log, t0, t1)
    meta = {k: v for k, v in log.meta.items() if isinstance(v, (str, int, float))}
    return {"traceEvents": ev, "displayTimeUnit": "ms", "metadata": {"t0_s": t0, "t1_s": t1, **meta}}


def write_timeline(
    path: str | os.PathLike[str], log: EventLog, t0: float = 0.0, t1: float | None = None
) -> None:
    atomic_write_json(path, chrome_trace(log, t0, t1))
