"""How busy other processes keep the machine while we measure (`asp-npu calibrate`'s noise check).

A thread samples, every `period` seconds, the CPU time (user + system) of every process that is not
this process or one of its descendants (our engines, Ray, the trainer ranks), and the 1-minute load
average. Each sample's foreign load is the CPU seconds other processes used since the previous sample
over the elapsed wall time and the machine's cores: 0.25 = a quarter of the machine was busy with
someone else's work. Processes that end between two samples are missed (a lower bound).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Any


def _our_pids() -> set[int]:
    import psutil  # type: ignore[import-untyped]

    me = psutil.Process()
    return {me.pid} | {c.pid for c in me.children(recursive=True)}


def _foreign_cpu(mine: set[int]) -> dict[int, tuple[float, float]]:
    """(CPU seconds so far, start time) of every process outside `mine`."""
    import psutil

    out: dict[int, tuple[float, float]] = {}
    for p in psutil.process_iter():
        if p.pid in mine:
            continue
        try:
            t = p.cpu_times()
            out[p.pid] = (t.user + t.system, p.create_time())
        except psutil.Error:
            continue
    return out


def foreign_share(before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]], t0: float,
                  wall_s: float, cores: int) -> float:
    """Other processes' CPU seconds between two snapshots taken at `t0` and `t0 + wall_s`, over
    `wall_s` x `cores`. A process absent from `before` counts whole when it started after `t0`, and not
    at all otherwise (it was there but unreadable, or it just left our tree)."""
    if wall_s <= 0 or cores < 1:
        return 0.0
    used = 0.0
    for pid, (cpu, started) in after.items():
        if pid in before:
            used += max(0.0, cpu - before[pid][0])
        elif started >= t0:
            used += cpu
    return used / (wall_s * cores)


def summarise(samples: list[tuple[float, float, float]]) -> dict[str, Any]:
    """(t, foreign share, load average) samples -> mean and max foreign share, highest load average."""
    shares = [s for _, s, _ in samples]
    return {"samples": len(samples), "mean": float(statistics.fmean(shares)) if shares else None,
            "max": max(shares) if shares else None,
            "loadavg_1m_max": max((la for *_, la in samples), default=None)}


class ForeignLoad:
    """`with ForeignLoad() as load: ...; load.summary()`: the foreign load while the block ran."""

    def __init__(self, period: float = 0.5) -> None:
        self.period = period
        self.cores = os.cpu_count() or 1  # other processes may run on any core of the machine
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="foreign-load", daemon=True)

    def _loop(self) -> None:
        t_prev, prev = time.time(), _foreign_cpu(_our_pids())
        while not self._stop.wait(self.period):
            now, cur = time.time(), _foreign_cpu(_our_pids())
            share = foreign_share(prev, cur, t_prev, now - t_prev, self.cores)
            self.samples.append((now, share, os.getloadavg()[0]))
            t_prev, prev = now, cur

    def __enter__(self) -> ForeignLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def summary(self) -> dict[str, Any]:
        return {**summarise(self.samples), "cores": self.cores, "period_s": self.period}
