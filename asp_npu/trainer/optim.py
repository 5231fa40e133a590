"""The trainer's optimizer, schedule and host-resident optimizer state, all megatron-core's own.

- `optimizer_config`: megatron's `OptimizerConfig` from `actor_config` (AdamW betas/eps/weight decay,
  clipping, precision, the distributed optimizer, and `optimizer_cpu_offload` /
  `optimizer_offload_fraction`, which make `get_megatron_optimizer` build its `HybridDeviceOptimizer`:
  that share of the fp32 master weights and Adam moments lives and is stepped in host memory).
- `build_scheduler`: megatron's `OptimizerParamScheduler`, counted in optimizer steps and stepped once
  after every successful optimizer step, as MindSpeed-RL's training engine does. Iteration keys
  (`lr_warmup_iters`, `lr_decay_iters`, `trainer.train_iters`) are converted with the run's optimizer
  steps per iteration (trainer steps per planning window x `ppo_epochs`); a warm-up fraction is of the
  decay steps, as in megatron. Its `state_dict` goes into the trainer checkpoint; a resume restores the
  position and keeps the config's schedule values (megatron's `override_opt_param_scheduler`).
- `optimizer_bytes`: the optimizer bytes measured on the live objects, split into device- and
  host-resident (what `asp-npu check` sizes per device and per node).
"""

from __future__ import annotations

from typing import Any

import torch

from asp_npu.config import ActorConfig, Config, warmup_and_decay_iters
from asp_npu.trainer.memory import _unique, optimizer_tensors, torch_optimizers


def optimizer_config(act: ActorConfig, dtype: str) -> Any:
    """megatron-core's OptimizerConfig for `actor_config` and the weights' dtype."""
    from megatron.core.optimizer import OptimizerConfig

    from asp_npu.trainer.model import DTYPES

    return OptimizerConfig(
        optimizer="adam", lr=act.lr, min_lr=act.min_lr, weight_decay=act.weight_decay,
        adam_beta1=act.adam_beta1, adam_beta2=act.adam_beta2, adam_eps=act.adam_eps, clip_grad=act.clip_grad,
        bf16=dtype == "bfloat16", fp16=dtype == "float16", params_dtype=DTYPES[dtype],
        use_distributed_optimizer=act.use_distributed_optimizer,
        optimizer_cpu_offload=act.optimizer_cpu_offload,
        optimizer_offload_fraction=act.optimizer_offload_fraction if act.optimizer_cpu_offload else 0.0)


def steps_per_iteration(cfg: Config) -> int:
    """Optimizer steps in one iteration: trainer steps per planning window x ppo_epochs."""
    from asp_npu.core.shape import RunShape

    return max(1, RunShape.from_config(cfg).steps_per_window) * max(1, cfg.actor_config.ppo_epochs)


def scheduler_values(cfg: Config) -> dict[str, Any]:
    """The OptimizerParamScheduler arguments `cfg` gives, in optimizer steps."""
    act = cfg.actor_config
    per = steps_per_iteration(cfg)
    warmup, decay = warmup_and_decay_iters(act, cfg.trainer.train_iters)
    wd_const = act.weight_decay_incr_style == "constant"
    return {"init_lr": act.lr_warmup_init if warmup else act.lr, "max_lr": act.lr, "min_lr": act.min_lr,
            "lr_warmup_steps": warmup * per, "lr_decay_steps": decay * per,
            "lr_decay_style": act.lr_decay_style,
            "start_wd": act.weight_decay if wd_const else act.start_weight_decay,
            "end_wd": act.weight_decay if wd_const else act.end_weight_decay,
            "wd_incr_steps": cfg.trainer.train_iters * per, "wd_incr_style": act.weight_decay_incr_style}


def build_scheduler(optimizer: Any, cfg: Config) -> Any:
    """megatron-core's OptimizerParamScheduler over `optimizer` (sets the step-0 lr on construction)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    return OptimizerParamScheduler(optimizer, **scheduler_values(cfg),
                                   use_checkpoint_opt_param_scheduler=False,
                                   override_opt_param_scheduler=True)


def current_lr(optimizer: Any) -> float:
    """The lr the next optimizer step uses (every parameter group shares the schedule)."""
    groups = optimizer.param_groups
    return float(groups[0]["lr"]) if groups else 0.0


def hybrid_optimizers(optimizer: Any) -> list[Any]:
    """megatron's HybridDeviceOptimizer instances inside a megatron optimizer (none without offload)."""
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer

    return [o for o in torch_optimizers(optimizer) if isinstance(o, HybridDeviceOptimizer)]


def host_optimizer_tensors(optimizer: Any) -> list[torch.Tensor]:
    """Tensors the hybrid optimizer keeps in host memory: the host copies of the offloaded master
    weights, their Adam moments and step, and the host gradient copies."""
    out: list[torch.Tensor] = []
    for hdo in hybrid_optimizers(optimizer):
        for opt in hdo.cpu_optimizers:
            for group in opt.param_groups:
                out += [p for p in group["params"] if isinstance(p, torch.Tensor)]
            for state in opt.state.values():
                out += [v for v in state.values() if isinstance(v, torch.Tensor)]
        out += [g for g in hdo.cpu_copy_map_grad.values() if isinstance(g, torch.Tensor) and g.numel()]
    return out


def optimizer_bytes(model: Any, optimizer: Any) -> dict[str, int]:
    """Measured optimizer bytes of this rank: `device` (Adam moments and fp32 master weights resident on
    the accelerator) and `host` (what megatron's HybridDeviceOptimizer keeps in host memory), each
    distinct storage once; fp32 training's master weights are the model's own and count in neither."""
    host = _unique(host_optimizer_tensors(optimizer))
    device = _unique(optimizer_tensors(model, optimizer), exclude=set(host))
    return {"device": sum(t.untyped_storage().nbytes() for t in device.values()),
            "host": sum(t.untyped_storage().nbytes() for t in host.values())}
