"""SIGTERM/SIGINT at any moment of a long command (train, bench real, calibrate, sft): stop at once.

Until a run's first trainer step starts (then `pipeline.resume.install_signals` checkpoints at the
next step boundary), a signal raises `Interrupted` where the command is: the `finally` blocks on the
way up shut the actors and Ray down (bounded) and `RunDir.rollback` removes the half-made run folder.
What the command started and that is still alive then — Ray's GCS and raylet, vLLM workers — is
ended by `end_children`: every process that descended from this one when the signal came (taken
then, before a dying parent hands its children to init), SIGTERM first, SIGKILL after a deadline.
A few steps must not be cut in half - setting a previous run's files aside and putting them back, a
folder swapped in: they run under `held()`, and a signal that lands there is raised when it ends.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

DEADLINE_S = 10.0  # for the descendants to exit after SIGTERM, before SIGKILL


class Interrupted(KeyboardInterrupt):
    """A signal during start-up; `exit_code` is 128 + the signal number (143 SIGTERM, 130 SIGINT)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_children: list[Any] = []
_received: list[int] = []  # the signals caught: Ray or asyncio may re-raise a plain KeyboardInterrupt
_held: list[int] = [0]  # depth of `held()` sections now running
_deferred: list[int] = []  # signals that landed in a `held()` section, raised when it ends


def _descendants() -> list[Any]:
    try:
        import psutil  # type: ignore[import-untyped]

        return list(psutil.Process().children(recursive=True))
    except Exception:  # noqa: BLE001 - psutil missing or a process gone mid-walk: best effort
        return []


def received() -> int | None:
    """The first signal `install`'s handler caught (None: none)."""
    return _received[0] if _received else None


def record(signum: int) -> Interrupted:
    """Note a signal (and the processes descended from this one now) as `install`'s handler does;
    returns the exception to raise. For a signal that reached us through another handler (Ray's)."""
    _received.append(signum)
    _children.extend(_descendants())
    return Interrupted(signum)


def _raise(signum: int, _frame: Any) -> None:
    exc = record(signum)
    if _held[0]:
        _deferred.append(signum)
        return
    raise exc


@contextmanager
def held() -> Iterator[None]:
    """Run a step that must not be cut in half (moving a run's files): a SIGTERM/SIGINT that lands in
    it is raised as `Interrupted` once it has ended (unless it ended with an exception of its own)."""
    _held[0] += 1
    pending: list[int] = []
    try:
        yield
    finally:
        _held[0] -= 1
        if not _held[0]:
            pending, _deferred[:] = _deferred[:], []
    if pending:
        raise Interrupted(pending[0])


def install() -> None:
    """SIGTERM and SIGINT raise `Interrupted` in the main thread from here on."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _raise)


def end_children(deadline_s: float = DEADLINE_S) -> int:
    """End what this command started that is still alive (SIGTERM, then SIGKILL after `deadline_s`);
    returns how many there were. Only our descendants at the time of the signal (or now) are touched."""
    import psutil

    alive = {p.pid: p for p in _children + _descendants() if _running(p) and p.pid != os.getpid()}
    procs = list(alive.values())
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, left = psutil.wait_procs(procs, timeout=deadline_s)
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=deadline_s)
    return len(procs)


def _running(p: Any) -> bool:
    try:
        return bool(p.is_running()) and p.status() != "zombie"
    except Exception:  # noqa: BLE001 - gone
        return False
