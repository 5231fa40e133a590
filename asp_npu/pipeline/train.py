"""One GRPO training run with the ASP asynchronous pipeline (what `asp-npu train` runs).

The caller has already loaded the config and checked it against this machine (`preflight`), so a
bad value costs one line and no half-made run directory. Then: build the model if configured and
missing, warm-start it (SFT) if configured, start the actors, train, write the run directory and
draw the report. The config stays as loaded; what the run derives (the policy it starts from, the
checkpoint a restart resumes from) is a `RunDerived` record (`derived.py`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from asp_npu import interrupt
from asp_npu.config import Config, to_dict
from asp_npu.core import run_dir as rd
from asp_npu.errors import UserError
from asp_npu.pipeline.derived import CONVERTED, WARM_STARTED, RunDerived


def config_yaml(cfg: Config) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg)))


def prepare_model(cfg: Config) -> None:
    """Build the tiny/small model when the path is missing and `model.build_if_missing` allows it."""
    path = Path(cfg.model.path)
    if path.exists():
        return
    from asp_npu.data.init_model import build_model_dir

    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    build_model_dir(path, cfg.model.size, seed=cfg.data.seed, arch=cfg.model.architecture)
    print(f"built model {path} ({cfg.model.size}) in {time.time() - t0:.1f}s", file=sys.stderr)


def warm_start(cfg: Config, run: rd.RunDir, derived: RunDerived) -> RunDerived:
    """Supervised warm start (`model.warm_start_steps` > 0): RL then starts from non-zero reward.

    The warm-started policy is written next to the run (`<run_dir>/warm_start`) and is the policy from
    here on (the record returned), so instances and trainer start from the same weights.
    """
    if cfg.model.warm_start_steps <= 0 or derived.resume_from:
        return derived  # a resumed run takes its weights from the checkpoint
    from asp_npu.trainer import sft

    out = run.path / rd.WARM_START
    t0 = time.time()
    result = sft.warm_start(cfg, out_dir=str(out), steps=cfg.model.warm_start_steps,
                            start=derived.rank_start())
    last = result["evals"][-1] if result.get("evals") else {}
    print(f"warm start: {cfg.model.warm_start_steps} SFT steps in {time.time() - t0:.1f}s -> {out} "
          f"(greedy reward {last.get('reward', float('nan')):.3f})", file=sys.stderr)
    return derived.with_policy(str(out), WARM_STARTED)


def initial_policy(run: rd.RunDir, derived: RunDerived) -> RunDerived:
    """`model.load_megatron`: the Megatron weights become an HF folder in the run directory that
    instances and trainer both start from (the policy from here on); a resumed run skips it."""
    if not derived.megatron or derived.resume_from:
        return derived
    from asp_npu.trainer.hf_export import megatron_to_hf_folder

    out = megatron_to_hf_folder(derived.megatron, derived.policy_path, run.path / "initial_policy")
    print(f"initial policy: {derived.megatron} -> {out}", file=sys.stderr)
    return derived.with_policy(str(out), CONVERTED)


def check_run_dir(cfg: Config, overwrite: bool = False) -> None:
    """Refuse (UserError) a `trainer.run_dir` the run may not use, before anything is built.
    A run resuming from `actor_config.load` keeps the checkpoints it finds there."""
    from asp_npu.outputs import run_dir_problem

    problem = rd.RunDir.reuse_problem(cfg.trainer.run_dir, overwrite,
                                      keep_checkpoints=bool(cfg.actor_config.load)) or run_dir_problem(
        cfg.trainer.run_dir, [("model.path", cfg.model.path), ("data.data_path", cfg.data.data_path)],
        cfg.actor_config.save, cfg.actor_config.load, overwrite)
    if problem:
        raise UserError(problem)


def load_run_prompts(cfg: Config) -> list[Any]:
    """The run's prompts (data section); none at all is a UserError, raised before the instances start
    (as is a bad held-out set for validation)."""
    from asp_npu.data.datasets import config_prompts, config_val_prompts

    prompts = config_prompts(cfg.data)
    if cfg.trainer.test_freq > 0:
        config_val_prompts(cfg.data)
    if not prompts:
        data = cfg.data
        where = f"data.data_path '{data.data_path}'" if data.data_path else f"data.task '{data.task}'"
        raise UserError(f"{where}: no prompts")
    return prompts


def train(cfg: Config, kind: str, console: bool = True, label: str = "",
          overwrite: bool = False) -> dict[str, Any]:
    """One training run into `trainer.run_dir` (config already preflighted); returns the run summary.

    The run directory is checked first and only prepared once the prompts and the model have passed,
    so a bad data path or an existing run costs one line and leaves the previous run as it was
    (`overwrite`: replace a previous run's checkpoints). Even then the previous run's files are only
    set aside: they are deleted once the new run has trained, and put back if it fails before its
    first trainer step (instances that cannot start, a failed warm start, Ctrl-C). SIGTERM/SIGINT
    checkpoint and raise `resume.Stopped`; a trainer rank that dies or hangs stops the run cleanly
    and, `trainer.max_restarts` times, starts it again from the last complete checkpoint (then
    `resume.TrainerFailed`)."""
    from asp_npu.observe.report import draw_report

    check_run_dir(cfg, overwrite)
    prompts = load_run_prompts(cfg)
    prepare_model(cfg)
    from asp_npu.data.init_model import check_model_dir

    check_model_dir(cfg.model.path)  # a torn config.json costs one line, before the run directory
    # resuming into the same run directory must not clear the checkpoint it resumes from
    # a run resuming into its own directory continues its samples, metrics and run log
    load = cfg.actor_config.load
    continuing = bool(load) and (Path(cfg.trainer.run_dir) / rd.SAMPLES).is_file()
    run: rd.RunDir | None = None
    try:
        with interrupt.held():  # a signal now lands once the previous run is set aside and `run` known
            run = rd.RunDir.create(cfg.trainer.run_dir, config_yaml(cfg), keep_checkpoints=bool(load),
                                   overwrite=overwrite, continue_streams=continuing)
        if continuing:
            run.continue_from(checkpoint_step(load))
        print(f"{f'[{label}] ' if label else ''}run {run.path}: config, {len(prompts)} prompts and model "
              f"{cfg.model.path} checked; starting Ray", file=sys.stderr, flush=True)
        summary = run_controller(cfg, run, prompts, kind, console, label)
    except BaseException:
        if run is not None:
            _end_failed(run)
        raise
    run.commit()
    draw_report(run.path)
    return summary


def _end_failed(run: rd.RunDir) -> None:
    """A run that failed or was interrupted: its steps stand if it trained any, else the run folder
    goes back to how it was (not cut in half by a second signal)."""
    with interrupt.held():
        if run.trained():
            run.commit()  # the new run's steps and checkpoints are the run now
        else:
            try:
                run.rollback()
            except OSError:
                pass  # the previous run stays in its previous-run.* folder; the run's own error is the news


def run_controller(cfg: Config, run: rd.RunDir, prompts: list[Any], kind: str, console: bool,
                   label: str) -> dict[str, Any]:
    """Warm start (if configured), then the controller from start to its summary (restarted from the
    last checkpoint when a trainer rank fails, `trainer.max_restarts` times). `cfg` is only read:
    each start gets it as loaded plus what the run derived."""
    derived = warm_start(cfg, run, initial_policy(run, RunDerived.at_start(cfg)))
    restarts: list[dict[str, Any]] = []  # each attempt's run_log starts with the restarts before it
    while True:
        summary = _attempt(cfg, derived, run, prompts, kind, console, label, restarts)
        if summary is not None:
            break
        derived = restart_point(cfg, derived, run)
        run.continue_from(checkpoint_step(derived.resume_from))  # the rows after it are trained again
    return summary


def checkpoint_step(load: str) -> int:
    """The trainer step of the checkpoint `actor_config.load` names (0: none, a start from scratch)."""
    from asp_npu.trainer.checkpoint import read_meta

    return int(read_meta(load)["step"]) if load else 0


def _attempt(cfg: Config, derived: RunDerived, run: rd.RunDir, prompts: list[Any], kind: str, console: bool,
             label: str, restarts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One start of the pipeline; None: a trainer rank failed and the run restarts from its checkpoint."""
    from asp_npu.pipeline import resume
    from asp_npu.pipeline.controller import Controller

    ctl = Controller(cfg, run, prompts, kind=kind, console=console, label=label, derived=derived)
    if restarts:  # the earlier restarts are in the run log this attempt continues
        ctl.recorder.event(**restarts[-1])
    t0 = time.time()
    handlers: dict[int, Any] = {}
    try:
        ctl.start()  # a signal now raises where it lands (asp_npu.interrupt): close() below ends it all
        handlers = resume.install_signals(ctl)  # from the first step on: checkpoint at a step boundary
        return ctl.run()
    except Exception as exc:  # noqa: BLE001 - only a trainer rank's failure is handled here
        failure = resume.trainer_failure(exc)
        if failure is None:
            raise
    finally:
        try:
            ctl.close()  # every actor, the queue and Ray: bounded, never raises
        finally:
            resume.restore_signals(handlers)
    root = resume.checkpoint_root(ctl)
    ckpt = resume.last_checkpoint(root)
    where = f"last checkpoint {root} (resume with actor_config.load={root})" if ckpt else "no checkpoint yet"
    line = f"{failure.who} failed at trainer step {ctl.step} ({time.time() - t0:.0f}s in): {failure}; {where}"
    limit = cfg.trainer.max_restarts
    if len(restarts) >= limit:
        raise resume.TrainerFailed(f"{line}; trainer.max_restarts={limit} used up")
    print(f"asp-npu: {line}; restarting the run from it ({len(restarts) + 1}/{limit})", file=sys.stderr,
          flush=True)
    restarts.append({"kind": "trainer_restart", "who": failure.who, "step": ctl.step, "cause": str(failure),
                     "from": str(ckpt or ""), "t_failed": time.time()})
    return None


def restart_point(cfg: Config, derived: RunDerived, run: rd.RunDir) -> RunDerived:
    """What a restart starts from: the last complete checkpoint (when none was written yet, where this
    run started: its own `actor_config.load`, or the beginning); the policy stays the one derived (the
    warm start is not repeated)."""
    from asp_npu.pipeline import resume

    root = Path(cfg.actor_config.save or run.checkpoints)
    return derived.restarted(str(root) if resume.last_checkpoint(root) else derived.resume_from)
