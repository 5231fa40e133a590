"""A pool of verifier processes: every call has a timeout, a hung or crashing verifier costs one sample 0.

Why a process per worker and not `ProcessPoolExecutor`: an executor cannot stop one stuck task, so a
verifier that loops forever (sympy on a hostile expression, a user's reward function) would hold its
worker, and in time every worker. Here each worker is one process behind a pipe; a call that does not
answer within `timeout_s` kills that process and a fresh one takes its slot on the next call; a call
that raises, or a worker that dies, returns 0 as well. The outcome of each call is counted
(`PoolStats`), and no caller ever waits longer than its own timeout plus the calls queued before it.

Callers pass a picklable `target` (a function at module level) and its arguments; workers start by
`spawn`, so a pool is safe inside the threads of a vLLM or Ray process.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

OK, TIMEOUT, ERROR = "ok", "timeout", "error"
START_S = 120.0  # the longest a new worker may take to start (a spawned interpreter on a busy host)


@dataclass
class PoolStats:
    calls: int = 0
    timeouts: int = 0
    errors: int = 0
    workers_replaced: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _serve(conn: Connection) -> None:
    """Worker loop: (fn, args) in, (status, value) out, until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the parent's to handle
    conn.send((OK, 0.0))  # up: a call's timeout counts from here, not from the process start
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            value = float(fn(*args))
            conn.send((OK, value) if math.isfinite(value) else (ERROR, f"not a finite score: {value}"))
        except Exception as exc:  # a verifier's bug scores 0; the worker lives on
            conn.send((ERROR, f"{type(exc).__name__}: {exc}"[:300]))


class _Worker:
    """One worker process, started on first use."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        self.proc: Any = None
        self.conn: Connection | None = None

    def ensure(self) -> Connection:
        if self.proc is None or not self.proc.is_alive():
            self.stop()
            parent, child = self._ctx.Pipe()
            self.proc = self._ctx.Process(target=_serve, args=(child,), daemon=True, name="asp-verifier")
            self.proc.start()
            child.close()
            self.conn = parent
            if not parent.poll(START_S):
                self.stop()
                raise OSError(f"a verifier worker did not start within {START_S:g} s")
            parent.recv()
        assert self.conn is not None
        return self.conn

    def stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.proc, self.conn = None, None


class VerifierPool:
    """`num_workers` verifier processes; `call` returns (value, status) and never blocks past its bound."""

    def __init__(self, num_workers: int = 2, timeout_s: float = 10.0) -> None:
        if num_workers < 1 or not timeout_s > 0:
            raise ValueError(f"verifier pool: need num_workers >= 1 and timeout_s > 0 "
                             f"(got {num_workers}, {timeout_s})")
        ctx = mp.get_context("spawn")
        self.timeout_s = float(timeout_s)
        self.stats = PoolStats()
        self._lock = threading.Lock()
        self._all = [_Worker(ctx) for _ in range(num_workers)]
        self._idle: queue.Queue[_Worker] = queue.Queue()
        for w in self._all:
            self._idle.put(w)
        self._closed = False
        self._waiting = 0  # callers waiting for a worker

    def call(self, target: Callable[..., float], *args: Any) -> tuple[float, str]:
        """target(*args) in a worker: (its value, "ok"), or (0.0, "timeout" | "error")."""
        with self._lock:  # each call ahead holds a worker at most its timeout plus a restart
            ahead, self._waiting = self._waiting, self._waiting + 1
        try:
            worker = self._idle.get(timeout=(ahead // len(self._all) + 1) * (self.timeout_s + START_S))
        except queue.Empty:
            return self._count(0.0, TIMEOUT)
        finally:
            with self._lock:
                self._waiting -= 1
        try:
            return self._run(worker, target, args)
        finally:
            self._idle.put(worker)

    def _run(self, worker: _Worker, target: Callable[..., float], args: tuple[Any, ...]) -> tuple[float, str]:
        if self._closed:
            return self._count(0.0, ERROR)
        try:
            conn = worker.ensure()
            conn.send((target, args))
            if not conn.poll(self.timeout_s):
                worker.stop()  # hung: the process goes, the slot restarts on its next call
                self._bump("workers_replaced")
                return self._count(0.0, TIMEOUT)
            status, value = conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            worker.stop()  # died mid-call (a crash, os._exit, out of memory)
            self._bump("workers_replaced")
            return self._count(0.0, ERROR)
        if status != OK:
            return self._count(0.0, ERROR)
        return self._count(float(value), OK)

    def _count(self, value: float, status: str) -> tuple[float, str]:
        with self._lock:
            self.stats.calls += 1
            if status == TIMEOUT:
                self.stats.timeouts += 1
            elif status == ERROR:
                self.stats.errors += 1
        return value, status

    def _bump(self, field: str) -> None:
        with self._lock:
            setattr(self.stats, field, getattr(self.stats, field) + 1)

    def close(self) -> None:
        self._closed = True
        for w in self._all:
            w.stop()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
