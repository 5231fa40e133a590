"""Bounded waits on Ray actors: every remote answer the driver waits for has a deadline and, when it
does not come, an error that names the actor it waited for (never a bare `GetTimeoutError` or a hang).

`get(refs, timeout, who)` is `ray.get` with that contract: `who` names the actor (or one name per ref);
a dead actor raises `ActorLost`, a missed deadline `ActorTimeout`, both with the name in one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CALL_S = 60.0  # a control call (state, admit, prompts, shutdown): answered in milliseconds when healthy


class ActorFailure(RuntimeError):
    """An actor the driver waited for is gone or silent; `who` names it."""

    def __init__(self, who: str, message: str) -> None:
        super().__init__(message)
        self.who = who


class ActorLost(ActorFailure):
    """The actor died (its process exited or was killed)."""


class ActorTimeout(ActorFailure):
    """The actor did not answer within the deadline."""


def _names(refs: Sequence[Any], who: str | Sequence[str]) -> list[str]:
    return [who] * len(refs) if isinstance(who, str) else list(who)


def get(refs: Any, timeout: float, who: str | Sequence[str], what: str = "") -> Any:
    """`ray.get(refs)` within `timeout` seconds; `who` names the actor (or each ref's actor)."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    single = not isinstance(refs, list | tuple)
    seq = [refs] if single else list(refs)
    names = _names(seq, who)
    doing = f" ({what})" if what else ""
    try:
        out = ray.get(seq, timeout=timeout)
    except GetTimeoutError:
        _, late = ray.wait(seq, num_returns=len(seq), timeout=0)
        silent = [n for r, n in zip(seq, names, strict=True) if r in late] or names
        raise ActorTimeout(silent[0], f"no answer from {', '.join(dict.fromkeys(silent))}{doing} "
                                      f"within {timeout:.0f}s") from None
    except RayActorError as exc:
        dead = names[0]
        for r, n in zip(seq, names, strict=True):
            try:
                ray.get(r, timeout=0)
            except RayActorError:
                dead = n
                break
            except Exception:  # noqa: BLE001 - only the dead one is being looked for
                continue
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ActorLost(dead, f"{dead} died{doing}: {first}") from None
    return out[0] if single else out


def kill_quietly(actor: Any) -> None:
    """`ray.kill` that never raises (the actor may be gone already)."""
    import ray

    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - cleanup must go on
        pass
