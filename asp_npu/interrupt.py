"""SIGTERM/SIGINT at any moment of a long command (train, bench real, calibrate, sft): stop at once.

Until a run's first trainer step starts (then `pipeline.resume.install_signals` checkpoints at the
next step boundary), a signal raises `Interrupted` where the command is: the `finally` blocks on the
way up shut the actors and Ray down (bounded) and `RunDir.rollback` removes the half-made run folder.
What the command started and that is still alive then — Ray's GCS and raylet, vLLM workers — is
ended by `end_children`: every process that descended from this one when the signal came (taken
then, before a dying parent hands its children to init), SIGTERM first, SIGKILL after a deadline.
"""

from __future__ import annotations

import os
import signal
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


def _descendants() -> list[Any]:
    try:
        import psutil  # type: ignore[import-untyped]

        return list(psutil.Process().children(recursive=True))
    except Exception:  # noqa: BLE001 - psutil missing or a process gone mid-walk: best effort
        return []


def received() -> int | None:
    """The first signal `install`'s handler caught (None: none)."""
    return _received[0] if _received else None


def _raise(signum: int, _frame: Any) -> None:
    _received.append(signum)
    _children.extend(_descendants())
    raise Interrupted(signum)


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
