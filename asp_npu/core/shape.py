"""RunShape: the numbers every part of a run derives from its config, computed once.

Group size, minibatch, planning window, steps per iteration and per weights version, the lag bound,
instances and world sizes used to be recomputed (with small differences) by the controller, the
preflight checks, the deployment estimate and the replay. `RunShape.from_config(cfg)` is the one
derivation; `shape_problems(cfg)` the one divisibility check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from asp_npu.core.modes import Mode, instances_on, max_lag, mode_spec


class Config(Protocol):
    """What the shape reads of `asp_npu.config.Config` (core imports nothing above it)."""

    @property
    def rl_config(self) -> Any: ...
    @property
    def generate_config(self) -> Any: ...
    @property
    def actor_config(self) -> Any: ...
    @property
    def trainer(self) -> Any: ...


def window_prompts(cfg: Config) -> int:
    """Prompts per planning window (MindSpeed-RL global_batch_size; 0 = one minibatch of groups)."""
    rl = cfg.rl_config
    return int(rl.global_batch_size or max(1, rl.mini_batch_size // max(1, rl.n_samples_per_prompt)))


def trainer_world(cfg: Config) -> int:
    """Trainer ranks: TP x PP x CP x DP."""
    a = cfg.actor_config
    return int(a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size
               * a.data_parallel_size)


def shape_problems(cfg: Config) -> list[str]:
    """Whole groups per minibatch and whole minibatches per planning window (one line each)."""
    rl = cfg.rl_config
    n, mbs = rl.n_samples_per_prompt, rl.mini_batch_size
    if n < 1 or mbs < n or mbs % n:
        return [f"rl_config.mini_batch_size: {mbs} does not hold whole groups of {n}"]
    window = window_prompts(cfg)
    if (window * n) % mbs:
        return [f"rl_config.global_batch_size: {window} prompts x {n} samples is not a whole number of "
                f"minibatches of {mbs}"]
    return []


@dataclass(frozen=True)
class RunShape:
    """A run's derived numbers (groups and steps count whole GRPO groups and trainer steps)."""

    mode: Mode
    group_size: int  # G: samples per prompt
    minibatch: int  # M: samples per trainer step
    minibatch_groups: int
    window: int  # prompts (groups) per planning window = one iteration
    steps_per_window: int
    iterations: int  # planning windows of the run (trainer.train_iters)
    steps_per_version: int  # k: trainer steps between two weight refreshes
    max_lag: int
    instances: int  # rollout instances (colocated modes: one per infer_tp devices)
    infer_tp: int
    slots: int  # max_num_seqs per instance
    trainer_world: int  # TP x PP x DP
    trainer_dp: int

    @classmethod
    def from_config(cls, cfg: Config, devices: int = 0, mode: Mode | None = None) -> RunShape:
        """The shape of `cfg`'s run on `devices` devices in all (0: the configured instance count).

        `mode` defaults to the config's resolved mode row (`rl_config.mode` + `generate_config.admission`).
        """
        rl, gen = cfg.rl_config, cfg.generate_config
        mode = mode or mode_spec(rl.mode, gen.admission)
        G, M = rl.n_samples_per_prompt, rl.mini_batch_size
        mb_groups = max(1, M // max(1, G))
        window = window_prompts(cfg)
        k = max(1, window // mb_groups) if mode.refresh_per_window else rl.weight_refresh_interval
        instances = gen.num_instances if not devices else \
            instances_on(gen.num_instances, gen.infer_tensor_parallel_size, mode.colocated, devices)
        return cls(mode=mode, group_size=G, minibatch=M, minibatch_groups=mb_groups, window=window,
                   steps_per_window=window * G // max(1, M), iterations=cfg.trainer.train_iters,
                   steps_per_version=k, max_lag=max_lag(rl.max_lag, mode), instances=instances,
                   infer_tp=gen.infer_tensor_parallel_size, slots=gen.max_num_seqs,
                   trainer_world=trainer_world(cfg), trainer_dp=cfg.actor_config.data_parallel_size)

    @property
    def total_steps(self) -> int:
        return self.iterations * self.steps_per_window

    @property
    def version_groups(self) -> int:
        """Groups consumed per weights version (the lag ledger's unit)."""
        return self.minibatch_groups * self.steps_per_version
