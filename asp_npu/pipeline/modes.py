"""The real-engine modes: ASP and the baselines it is compared with, as settings of one controller.

Every mode gets the same instances, trainer, prompts, seeds and minibatch (ARCHITECTURE.md section 7);
they differ only in what the real systems differ in:

- `asp`            offline ASP plan per window (padding -> skewness -> sorting), each instance runs its
                   own ordered units (`generate_config.admission=unit`); under continuous admission
                   the window's groups stream out through `schedule.dispatch.StreamDispatcher` (longest
                   predicted first, spread by in-flight KV load), as in the simulator; asynchronous,
                   lag bounded by `rl_config.max_lag`; weight refresh every `weight_refresh_interval` steps.
- `async-fifo`     the same asynchronous pipeline with plain FIFO dispatch: units of the same size in
                   prompt order, pulled by whichever instance is free ("scheduling alone" is the gap).
- `one-step-off`   verl one-step off-policy: FIFO, disaggregated, the next global batch generates with the
                   previous weights while the trainer trains; weights sync once per global batch (lag 1).
- `sortedrl`       online length-aware (SortedRL): every admitted group is submitted at once
                   (oversubscribed continuous batching), the trainer takes the shortest finished groups
                   first, bounded by the same lag cache. Partial rollout (interrupt + resume under new
                   weights) is not implemented: unfinished long samples keep generating ("keep" mode).
- `mindspeed-sync` MindSpeed-RL integrated worker: colocated and strictly alternating. Per global batch:
                   engines wake, weights refresh, all instances generate the whole batch (FIFO, vLLM
                   continuous batching over all of it, as MindSpeed-RL hands vLLM the whole batch), engines
                   sleep (free memory where vLLM can; on CPU they stop), then the trainer runs every
                   minibatch step of that batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from asp_npu.config import Config
from asp_npu.errors import ConfigError

REAL_MODES = ("asp", "async-fifo", "one-step-off", "sortedrl", "mindspeed-sync")


@dataclass(frozen=True)
class ModeSpec:
    name: str
    planner: str  # "asp" (offline planner) | "fifo" (prompt order)
    dispatch: str  # "static" (each instance its plan list) | "pull" (next unit to whichever is free)
    #                | "stream" (a group per dispatch, chosen by StreamDispatcher for the asking instance)
    admission: str  # RolloutInstance admission: "unit" (unit = one batch) | "continuous"
    queue_order: str  # TrainQueue handout order among due groups: "fifo" | "shortest"
    colocated: bool  # strictly alternating rollout / training on the same devices
    refresh_per_window: bool  # weights refresh once per global batch instead of every k steps
    lookahead_units: int  # unit admission: units queued behind the running one (continuous: a sample backlog)
    fixed_lag: int | None = None  # lag bound the mode implies (None: rl_config.max_lag)
    fixed_admission: bool = False  # False: generate_config.admission decides (same for asp and fifo)


SPECS = {
    "asp": ModeSpec("asp", "asp", "static", "unit", "fifo", False, False, 1),
    "async-fifo": ModeSpec("async-fifo", "fifo", "pull", "unit", "fifo", False, False, 1),
    "one-step-off": ModeSpec("one-step-off", "fifo", "pull", "unit", "fifo", False, True, 1, fixed_lag=1),
    "sortedrl": ModeSpec("sortedrl", "fifo", "pull", "continuous", "shortest", False, False, 1,
                         fixed_admission=True),
    "mindspeed-sync": ModeSpec("mindspeed-sync", "fifo", "pull", "continuous", "fifo", True, True, 1,
                               fixed_lag=0, fixed_admission=True),
}


def mode_spec(name: str, admission: str | None = None) -> ModeSpec:
    """The mode's settings; `admission` (generate_config.admission) applies where the mode lets it."""
    if name not in SPECS:
        raise ConfigError(
            f"rl_config.mode: '{name}' has no real-engine implementation (choose {', '.join(REAL_MODES)})"
        )
    spec = SPECS[name]
    if admission is None or spec.fixed_admission:
        return spec
    spec = replace(spec, admission=admission)
    if spec.planner == "asp" and admission == "continuous":
        spec = replace(spec, dispatch="stream")
    return spec


def instance_count(cfg: Config, colocated: bool, devices: int) -> int:
    """Rollout instances of a run on `devices` devices in all (CPU: cores).

    A colocated mode generates on every device, one instance per `infer_tensor_parallel_size` of them,
    as MindSpeed-RL's integrated worker and verl's hybrid engine do (the baseline gets all devices for
    rollout); an asynchronous mode runs `generate_config.num_instances` on its rollout devices.
    """
    gen = cfg.generate_config
    return instances_on(gen.num_instances, gen.infer_tensor_parallel_size, colocated, devices)


def instances_on(num_instances: int, infer_tp: int, colocated: bool, devices: int) -> int:
    """`instance_count` from the numbers alone (what a run directory's config.yaml gives the replay)."""
    return max(num_instances, devices // infer_tp) if colocated else num_instances


def steps_per_version(cfg: Config, spec: ModeSpec, window_groups: int) -> int:
    """Trainer steps between two weight refreshes (= trainer steps per lag-ledger version)."""
    mb_groups = cfg.rl_config.mini_batch_size // cfg.rl_config.n_samples_per_prompt
    if spec.refresh_per_window:
        return max(1, window_groups // mb_groups)
    return cfg.rl_config.weight_refresh_interval


def max_lag(cfg: Config, spec: ModeSpec) -> int:
    return cfg.rl_config.max_lag if spec.fixed_lag is None else spec.fixed_lag
