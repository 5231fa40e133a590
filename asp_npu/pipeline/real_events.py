"""Turn what a real run recorded into the shared `EventLog`, so real and simulated runs share one accounting.

Sources: each RolloutInstance's per-sequence start/finish and per-unit start/finish events (wall
clock), and the controller's own records: when it withheld an instance's next unit for admission
(back-pressure), when an instance was loading new weights, when the devices were lent to the
trainer (colocated modes), and the trainer's busy / refresh intervals. An instance's state at time t:

    lent     colocated mode and the trainer holds the devices
    paused   loading new weights (weight_refresh) or asleep
    run      a unit is running or sequences are in flight (idle slots = padding)
    blocked  its next unit is withheld by the lag bound / queue (sorting)
    drained  nothing left to run (skewness while others generate)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from asp_npu.observe.events import EventLog

Interval = tuple[float, float]


@dataclass
class InstanceRecord:
    """Controller-side intervals of one instance (the instance reports its own sequences and units)."""

    blocked: list[Interval] = field(default_factory=list)
    paused: list[Interval] = field(default_factory=list)
    lent: list[Interval] = field(default_factory=list)
    frozen: list[Interval] = field(default_factory=list)  # running sequences stopped by a weight_refresh
    _blocked_since: float | None = None

    def set_blocked(self, t: float, blocked: bool) -> None:
        if blocked and self._blocked_since is None:
            self._blocked_since = t
        elif not blocked and self._blocked_since is not None:
            if t > self._blocked_since:
                self.blocked.append((self._blocked_since, t))
            self._blocked_since = None

    def close(self, t: float) -> None:
        self.set_blocked(t, False)


@dataclass
class TrainerRecord:
    busy: list[Interval] = field(default_factory=list)
    paused: list[Interval] = field(default_factory=list)  # weight gathering / refresh on the critical path
    lent: list[Interval] = field(default_factory=list)  # colocated: devices run rollout


def _state(c: dict[str, int]) -> str:
    if c["lent"] > 0:
        return "lent"
    if c["paused"] > 0:
        return "paused"
    if c["unit"] > 0 or c["seq"] > 0:
        return "run"
    if c["blocked"] > 0:
        return "blocked"
    return "drained"


def instance_states(
    stats: dict[str, Any], rec: InstanceRecord, t0: float, t1: float
) -> list[tuple[float, int, str]]:
    """(t, running sequences, state) change points of one instance over [t0, t1]."""
    points: list[tuple[float, str, int]] = []
    for e in stats.get("sequence_events", []):
        points.append((float(e["t"]), "seq", 1 if e["event"] == "start" else -1))
    for e in stats.get("unit_events", []):
        points.append((float(e["t"]), "unit", 1 if e["event"] == "unit_start" else -1))
    for kind in ("blocked", "paused", "lent"):
        for a, b in getattr(rec, kind):
            points.append((a, kind, 1))
            points.append((b, kind, -1))
    points.sort(key=lambda p: (p[0], p[2]))
    counts = {"seq": 0, "unit": 0, "blocked": 0, "paused": 0, "lent": 0}
    out: list[tuple[float, int, str]] = []
    k = 0
    while k < len(points):
        t = points[k][0]
        while k < len(points) and points[k][0] == t:
            counts[points[k][1]] += points[k][2]
            k += 1
        running = max(0, counts["seq"])
        state = _state(counts)
        tt = min(max(t, t0), t1)
        if out and out[-1][0] == tt:
            out[-1] = (tt, running, state)
        elif not out or out[-1][1:] != (running, state):
            out.append((tt, running, state))
    if not out or out[0][0] > t0:
        out.insert(0, (t0, 0, "drained"))
    return out


def trainer_states(rec: TrainerRecord, t0: float) -> list[tuple[float, str]]:
    """(t, state) change points: busy / paused / lent intervals; `wait` in between."""
    marks = [(a, b, "busy") for a, b in rec.busy] + [(a, b, "paused") for a, b in rec.paused]
    marks += [(a, b, "lent") for a, b in rec.lent]
    marks.sort()
    out = [(t0, "wait")]
    for a, b, s in marks:
        out.append((max(a, t0), s))
        out.append((max(b, t0), "wait"))
    return out


def build_event_log(
    instance_stats: list[dict[str, Any]],
    instance_records: list[InstanceRecord],
    trainer: TrainerRecord,
    slots: int,
    trainer_devices: int,
    colocated: bool,
    t0: float,
    t1: float,
    queue_series: dict[str, Any] | None = None,
    versions: list[tuple[float, int]] | None = None,
    iterations: list[float] | None = None,
    unit_labels: dict[int, str] | None = None,
    group_size: int = 1,
) -> EventLog:
    """The run's EventLog over [t0, t1] (one device per instance; trainer devices as given)."""
    n = len(instance_stats)
    log = EventLog(
        devices=n if colocated else n + trainer_devices,
        trainer_devices=n if colocated else trainer_devices,
        colocated=colocated,
    )
    for i, (st, rec) in enumerate(zip(instance_stats, instance_records, strict=True)):
        log.add_instance(1, slots)
        for t, running, state in instance_states(st, rec, t0, t1):
            log.instance_state(t, i, running, state)
        starts: dict[int, tuple[float, int]] = {}
        for e in st.get("unit_events", []):
            if e["event"] == "unit_start":
                starts[int(e["unit"])] = (float(e["t"]), int(e.get("samples", 0)))
            elif int(e["unit"]) in starts:
                a, k = starts.pop(int(e["unit"]))
                if float(e["t"]) < t0:  # engine warm-up before the run's clock started
                    continue
                label = (unit_labels or {}).get(int(e["unit"]), f"u{e['unit']}")
                log.unit(i, label, a, float(e["t"]), k)
    for t, s in trainer_states(trainer, t0):
        log.trainer_state(min(t, t1), s)
    if queue_series:
        qs = queue_series
        for t, q, f in zip(qs["t"], qs["queued"], qs["in_flight"], strict=False):
            if t0 <= t <= t1:
                log.queue(t, q * group_size, f * group_size)
    for t, v in versions or []:
        log.version(t, v)
    for t in iterations or []:
        log.iteration(t)
    # close every track at t1 so the accounting integrates the same span for all
    for i in range(n):
        last = [x for x in log.inst if x[1] == i][-1]
        log.instance_state(t1, i, last[2], last[3])
    log.trainer_state(t1, log.trainer[-1][1])
    return log
