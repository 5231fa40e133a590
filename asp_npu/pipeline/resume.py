"""Exact resume, a clean stop on SIGTERM/SIGINT, and the trainer's failures, for the pipeline.

A checkpoint is the trainer's shards plus the pipeline's state in the same iteration folder
(`<root>/iter_<step>/pipeline.pkl`), committed together by the pointer `<root>/latest.json` only after
both are complete (`asp_npu.trainer.checkpoint`). The pipeline's state is what makes the resumed run
consume exactly the groups the uninterrupted run would have -- same ids, none twice, none skipped:

- the TrainQueue: groups generated and not consumed, with their versions and trajectories (behaviour
  logprobs included), and the consumed count, so lag deadlines continue where they were;
- the ledger of consumed group ids, in handout order;
- the data position: the next window to plan and, of the windows already planned, every group neither
  consumed nor queued (dispatched, admitted or waiting): these are planned and generated again after
  the resume, each exactly once;
- the predictor's observations (`state_dict`) and its predictions for the next window's prompts at the
  stop, which the resumed run checks against its own (`predictor_restored` in `run_log.jsonl`).

A signal sets `Controller.stop_signal`; the loop finishes the trainer step in flight, checkpoints and
raises `Stopped`, and the command prints where the checkpoint is and how to resume. A trainer rank that
dies or hangs surfaces as an `ActorFailure` naming it; `train()` then shuts every actor and Ray down and
either stops with one line or (`trainer.max_restarts`) starts again from the last complete checkpoint.
"""

from __future__ import annotations

import os
import pickle
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from asp_npu.config import Config
from asp_npu.core.policy import DispatchPolicy
from asp_npu.core.run_dir import RunDir
from asp_npu.core.shape import RunShape
from asp_npu.core.train_queue import QueuedGroup
from asp_npu.core.window import GroupSupply
from asp_npu.errors import ConfigError
from asp_npu.io import atomic_write
from asp_npu.predict.base import Predictor
from asp_npu.remote import CALL_S, ActorFailure, get
from asp_npu.trainer.checkpoint import POINTER, commit_checkpoint, read_meta
from asp_npu.types import PromptItem

if TYPE_CHECKING:
    from collections.abc import Callable

    from asp_npu.pipeline.fleet import Fleet
    from asp_npu.pipeline.recorder import Recorder

STATE = "pipeline.pkl"
CRITIC = "critic"  # PPO: the critic's checkpoint root inside a trainer iteration folder
SCHEMA = "asp-pipeline-state/1"
PROBE = 256  # prompts whose predictions are kept to check the restored predictor


class RunState(Protocol):
    """What a checkpoint, a stop and a resume read and move: the run's position (trainer steps, the
    lag ledger's base, the next window, the groups planned and filtered), the fleet's trainer and
    TrainQueue, the dispatch policy, the predictor, and the recorder (the Controller is one)."""

    cfg: Config
    run_dir: RunDir
    fleet: Fleet
    shape: RunShape
    policy: DispatchPolicy
    predictor: Predictor
    recorder: Recorder
    supply: GroupSupply
    window_items: Callable[[int], list[PromptItem]]
    step: int
    base: int
    saved: int
    next_window: int
    stop_signal: str | None
    resumed_pending: int | None

    def prompt_len(self, item: PromptItem) -> int: ...

    def plan_items(self, w: int, items: list[PromptItem]) -> None: ...


class Stopped(Exception):
    """The run stopped on a signal after writing its checkpoint."""

    def __init__(self, signame: str, step: int, path: Path, root: Path) -> None:
        super().__init__(f"stopped by {signame} at trainer step {step}; checkpoint: {path}; resume with "
                         f"the same command and actor_config.load={root}")
        self.signame, self.step, self.path, self.root = signame, step, path, root

    @property
    def exit_code(self) -> int:
        return 128 + int(getattr(signal, self.signame, signal.SIGTERM))


class TrainerFailed(RuntimeError):
    """A trainer rank died or hung and no restart is left; the message is the one line for the user."""


@dataclass
class PipelineState:
    step: int
    base: int  # the step the lag ledger counts from (kept across resumes)
    next_window: int
    consumed: int  # groups handed to the trainer since `base`
    consumed_ids: list[str]
    queued: list[QueuedGroup]
    pending: list[tuple[int, str]]  # (window, group id): planned, neither consumed nor queued
    predictor: dict[str, Any] | None
    probe: tuple[list[str], list[int], list[float]] = field(default_factory=lambda: ([], [], []))
    schema: str = SCHEMA
    filtered_ids: tuple[str, ...] = ()  # DAPO dynamic sampling: finished, consumed without training


def checkpoint_root(ctrl: RunState) -> Path:
    """`actor_config.save`, else `<run_dir>/checkpoints`."""
    return Path(ctrl.cfg.actor_config.save or ctrl.run_dir.checkpoints)


def _probe(ctrl: RunState) -> tuple[list[str], list[int], list[float]]:
    items = ctrl.window_items(ctrl.next_window)[:PROBE] if ctrl.next_window < ctrl.shape.iterations else []
    ids = [it.meta["base_id"] for it in items]
    plens = [ctrl.prompt_len(it) for it in items]
    if not ids:
        return [], [], []
    est = ctrl.predictor.predict_many(np.array(ids, dtype=str), np.array(plens, dtype=np.int64))
    return ids, plens, [float(x) for x in est.mean]


def capture(ctrl: RunState) -> PipelineState:
    """The pipeline's state between two trainer steps (no handout outstanding)."""
    snap = get(ctrl.fleet.queue.snapshot.remote(), CALL_S, "the TrainQueue actor", "snapshot")
    done = set(snap["consumed_ids"]) | {str(g.group_id) for g in snap["queued"]} | set(snap["filtered_ids"])
    pol = ctrl.policy
    pending = [(pol.units[uid].window, str(g)) for g, uid in pol.group_unit.items() if str(g) not in done]
    pred = ctrl.predictor.state_dict() if hasattr(ctrl.predictor, "state_dict") else None
    return PipelineState(ctrl.step, ctrl.base, ctrl.next_window, snap["consumed"], snap["consumed_ids"],
                         snap["queued"], pending, pred, _probe(ctrl),
                         filtered_ids=tuple(snap["filtered_ids"]))


def save(ctrl: RunState, reason: str) -> Path:
    """Trainer shards, then the pipeline's state, then the pointer; returns the iteration folder."""
    root = checkpoint_root(ctrl)
    it = Path(ctrl.fleet.trainer.save(str(root), False))
    if ctrl.fleet.critic is not None:  # PPO: the critic's own checkpoint inside the iteration folder
        ctrl.fleet.critic.save(str(it / CRITIC), True)
    state = capture(ctrl)
    atomic_write(it / STATE, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
    commit_checkpoint(root, it, pipeline=STATE)
    ctrl.saved = ctrl.step
    ctrl.recorder.event("checkpoint", step=ctrl.step, path=str(it), reason=reason, queued=len(state.queued),
                        pending=len(state.pending), consumed=len(state.consumed_ids))
    return it


def stop(ctrl: RunState) -> None:
    """Checkpoint and raise `Stopped` (called between trainer steps once a signal came)."""
    signame = ctrl.stop_signal or "SIGTERM"
    it = save(ctrl, signame)
    raise Stopped(signame, ctrl.step, it, checkpoint_root(ctrl))


def load_state(path: str | Path) -> PipelineState | None:
    """The pipeline state of the checkpoint `path` names (None: a trainer-only checkpoint)."""
    f = Path(read_meta(path)["path"]) / STATE
    if not f.is_file():
        return None
    try:
        state = pickle.loads(f.read_bytes())  # noqa: S301 - our own checkpoint, as torch.load of the RNG
    except Exception as exc:  # noqa: BLE001 - any unreadable state is one line
        raise ConfigError(f"{f}: unreadable pipeline state ({type(exc).__name__}: {exc})") from None
    return state if getattr(state, "schema", None) == SCHEMA else None


def restore_critic(fleet: Fleet, load: str) -> None:
    """PPO's critic from the checkpoint's `critic/` (its weights, optimizer, version); one line if absent."""
    folder = Path(read_meta(load)["path"]) / CRITIC
    if not folder.is_dir():
        raise ConfigError(f"actor_config.load: {load} holds no critic checkpoint ({folder}); a PPO run "
                          "(adv_estimator gae) resumes from a checkpoint of one")
    meta = fleet.critic.load(str(folder))
    fleet.ppo.critic_version = int(meta["policy_version"])
    fleet.ppo.steps = int(meta["step"])


def restore(ctrl: RunState, load: str) -> None:
    """Trainer from `load`; with a pipeline state also the queue, the ledger, the data position (the
    pending groups planned again) and the predictor. A trainer-only checkpoint resumes at its
    iteration boundary (preflight checked it is one)."""
    meta = ctrl.fleet.trainer.load(load)
    ctrl.step = ctrl.base = ctrl.saved = int(meta["step"])
    if ctrl.fleet.critic is not None:
        restore_critic(ctrl.fleet, load)
    state = load_state(load)
    if state is not None:
        ctrl.base = state.base
    get(ctrl.fleet.queue.set_base.remote(ctrl.base), CALL_S, "the TrainQueue actor", "set_base")
    if state is None:
        ctrl.next_window = ctrl.step // ctrl.shape.steps_per_window
        ctrl.supply.planned = ctrl.next_window * ctrl.shape.window
        return
    ctrl.next_window = state.next_window
    get(ctrl.fleet.queue.restore.remote(state.consumed, state.consumed_ids, state.queued,
                                        state.filtered_ids), CALL_S, "the TrainQueue actor", "restore")
    ctrl.supply.filtered = len(state.filtered_ids)
    ctrl.supply.planned = len(state.consumed_ids) + len(state.queued) + len(state.filtered_ids)
    if state.predictor is not None and hasattr(ctrl.predictor, "load_state_dict"):
        ctrl.predictor.load_state_dict(state.predictor)
    ids, plens, before = state.probe
    diff = 0.0
    if ids:
        now = ctrl.predictor.predict_many(np.array(ids, dtype=str), np.array(plens, dtype=np.int64)).mean
        diff = float(np.max(np.abs(np.asarray(now) - np.asarray(before))))
    ctrl.recorder.event("predictor_restored", prompts=len(ids), max_abs_diff=diff)
    by_window: dict[int, set[str]] = {}
    for w, gid in state.pending:
        by_window.setdefault(w, set()).add(gid)
    for w, gids in sorted(by_window.items()):
        ctrl.plan_items(w, [it for it in ctrl.window_items(w) if it.prompt_id in gids])
    ctrl.resumed_pending = len(state.pending)
    ctrl.recorder.event("resumed", step=ctrl.step, path=meta["path"], queued=len(state.queued),
                        pending=len(state.pending), consumed=len(state.consumed_ids))


def consumed_ids(ctrl: RunState) -> list[str]:
    """The run's ledger of consumed group ids (a resumed run's includes those before the resume)."""
    return list(get(ctrl.fleet.queue.snapshot.remote(), CALL_S, "the TrainQueue actor", "snapshot")
                ["consumed_ids"])


def filtered_ids(ctrl: RunState) -> list[str]:
    """Group ids DAPO dynamic sampling consumed without training (a resumed run's included)."""
    return list(get(ctrl.fleet.queue.snapshot.remote(), CALL_S, "the TrainQueue actor", "snapshot")
                ["filtered_ids"])


def trainer_failure(exc: BaseException) -> ActorFailure | None:
    """The exception as a trainer rank's failure, or None when it is something else."""
    if isinstance(exc, ActorFailure) and exc.who.startswith("trainer rank"):
        return exc
    return None


def last_checkpoint(root: Path) -> Path | None:
    """The committed checkpoint under `root` (None: none yet)."""
    return root if (root / POINTER).is_file() else None


def install_signals(ctrl: RunState) -> dict[int, Any]:
    """SIGTERM/SIGINT: checkpoint at the next step boundary and stop; a second signal stops at once.
    Returns the handlers it replaced (for `restore_signals`); none off the main thread."""
    import threading

    def on_signal(signum: int, _frame: Any) -> None:
        if ctrl.stop_signal is not None:
            raise KeyboardInterrupt
        ctrl.stop_signal = signal.Signals(signum).name  # the loop looks at it at least every second
        os.write(2, f"asp-npu: {ctrl.stop_signal}: checkpointing after the trainer step in flight, then "
                    "stopping (send it again to stop at once, without a checkpoint)\n".encode())

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}


def restore_signals(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
