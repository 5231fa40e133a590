"""Checks a training config against this machine before any actor, engine or process group starts.

`asp_npu.config.validate` holds the hardware-independent checks (max_lag >= 0, whole groups per
minibatch, ...); this adds what depends on the machine and the filesystem: enough cores/devices for
the instances and trainer ranks, a model folder that exists and looks like an HF model, and a
planning window that holds whole trainer steps. All problems are reported in one ConfigError line.
"""

from __future__ import annotations

from pathlib import Path

from asp_npu.config import MODES, Config, validate
from asp_npu.core.modes import COLOCATED_MODES, REAL_MODES
from asp_npu.core.shape import RunShape, shape_problems, trainer_world, window_prompts
from asp_npu.device import DEVICE_SETTINGS, DeviceKind, available_devices, detect, spec
from asp_npu.errors import ConfigError

__all__ = ["device_problems", "preflight", "resume_problems", "resume_step", "window_prompts"]


def device_problems(cfg: Config, kind: DeviceKind, devices_per_node: int) -> list[str]:
    """Instances and trainer ranks against the devices (CPU: cores) the run may use."""
    gen = cfg.generate_config
    total = devices_per_node * max(1, cfg.trainer.nnodes)
    rollout = gen.num_instances * gen.infer_tensor_parallel_size
    world = trainer_world(cfg)
    unit = spec(kind).unit
    where = f"{total} {unit}"
    problems = []
    if rollout > total:
        problems.append(
            f"generate_config.num_instances: {gen.num_instances} instances x TP "
            f"{gen.infer_tensor_parallel_size} need {rollout} {unit}, this run has {where}"
        )
    if world > total:
        problems.append(f"actor_config: trainer world size {world} (TP x PP x DP) exceeds {where}")
    # on accelerators disaggregated modes give rollout and trainer disjoint cards; on CPU they share cores
    if not spec(kind).shared_cores and cfg.rl_config.mode not in COLOCATED_MODES and rollout + world > total:
        problems.append(
            f"generate_config.num_instances: {rollout} rollout + {world} trainer devices exceed {where} "
            f"(mode {cfg.rl_config.mode} does not colocate them)"
        )
    return problems


def preflight(cfg: Config, devices_per_node: int | None = None) -> DeviceKind:
    """Raise one ConfigError naming every problem; return the device kind the run will use."""
    problems = validate(cfg)
    rl = cfg.rl_config
    model = Path(cfg.model.path)
    if model.exists() and not (model / "config.json").is_file():
        problems.append(f"model.path: '{cfg.model.path}' is not an HF model folder (no config.json)")
    problems += [p for p in shape_problems(cfg) if p.startswith("rl_config.global_batch_size")]
    if rl.mode in MODES and rl.mode not in REAL_MODES:
        real = ", ".join(REAL_MODES)
        problems.append(f"rl_config.mode: '{rl.mode}' runs only in the simulator (real: {real})")
    if rl.predictor not in ("history", "prompt-len"):
        problems.append(f"rl_config.predictor: '{rl.predictor}' cannot run online (history|prompt-len)")
    if rl.global_batch_size < 0:
        problems.append(f"rl_config.global_batch_size: must be >= 0 (got {rl.global_batch_size})")
    try:
        kind = detect(cfg.trainer.device if cfg.trainer.device in DEVICE_SETTINGS else "auto")
    except RuntimeError as exc:
        problems.append(f"trainer.device: {exc}")
        kind = "cpu"
    n = devices_per_node or cfg.trainer.n_devices_per_node or available_devices(kind)
    problems += device_problems(cfg, kind, n)
    if cfg.actor_config.load and not problems:
        problems += resume_problems(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    return kind


def resume_step(cfg: Config) -> int:
    """The trainer step a run resumed from `actor_config.load` continues after (0 = a fresh run)."""
    if not cfg.actor_config.load:
        return 0
    from asp_npu.trainer.checkpoint import read_meta

    return int(read_meta(cfg.actor_config.load)["step"])


def resume_problems(cfg: Config) -> list[str]:
    """A checkpoint with the pipeline's state resumes at any step; a trainer-only one at an iteration
    (planning window) and weight-refresh boundary."""
    load = cfg.actor_config.load
    try:
        step = resume_step(cfg)
    except ConfigError as exc:
        return [str(exc)]
    from asp_npu.pipeline.resume import load_state

    shape = RunShape.from_config(cfg)
    per_window, k, total = shape.steps_per_window, shape.steps_per_version, shape.total_steps
    if (step % per_window or step % k) and load_state(load) is None:  # exact resume: any step
        return [f"actor_config.load: '{load}' is at step {step}; a run resumes at an iteration boundary "
                f"(a multiple of {per_window} steps and of the refresh interval {k}): set trainer.save_freq "
                "to a multiple of both"]
    if step >= total:
        return [f"actor_config.load: '{load}' is at step {step}, trainer.train_iters="
                f"{cfg.trainer.train_iters} is {total} steps: nothing left to train"]
    return []
