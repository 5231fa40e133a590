"""Trainer checkpoints through megatron-core's `dist_checkpointing`: reshardable across TP/PP/DP.

Layout of `<dir>/`:
- `iter_<step>/dist/` — the sharded state dict of the model and the optimizer (Adam moments, fp32
  master weights, step), saved by every rank in parallel; each tensor is stored in its global
  (unsharded) coordinates, so it loads into any TP/PP/DP layout of the same model (the distributed
  optimizer's state in megatron's `fully_reshardable` form);
- `iter_<step>/rng_rank<r>.pt` — each rank's RNG states (torch, numpy, python, megatron's tracker),
  restored when the layout is unchanged (dropout is off, so a resharded resume does not depend on them);
- `latest.json` — step, policy version, layout and optimizer kind; written last, atomically, after a
  barrier, so a crash mid-save leaves the previous checkpoint as the one that loads.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asp_npu.errors import ConfigError
from asp_npu.io import atomic_write_json

SCHEMA = "asp-trainer-ckpt/2"


def _rng_state() -> dict[str, Any]:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "tracker": {k: v.clone() for k, v in get_cuda_rng_tracker().get_states().items()}}


def _set_rng_state(state: dict[str, Any]) -> None:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    get_cuda_rng_tracker().set_states(state["tracker"])


_OPT_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


def _allocate_optimizer_state(optimizer: Any) -> None:
    """torch's Adam has no state (not even its step) before its first step, and megatron's distributed
    optimizer builds the state dict it loads into from that state: let megatron allocate it."""
    for part in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        if hasattr(part, "_init_optimizer_states_with_dummy_values"):
            if not part.optimizer.state:
                part._init_optimizer_states_with_dummy_values()
            _copy_loaded_states(part)


def _copy_loaded_states(part: Any) -> None:
    """megatron 0.16's distributed optimizer, loading into torch's Adam (no Transformer Engine/apex
    fused Adam), copies every key of the live Adam state, `step` included, from a source that has
    no `step` (restored separately from the param groups): copy the keys the source has."""
    if part.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
        return

    def set_states(model_param: Any, tensors: dict[str, torch.Tensor]) -> None:
        group, order = part.model_param_group_index_map[model_param]
        main = part.optimizer.param_groups[group]["params"][order]
        dst = {"param": main, **part.optimizer.state[main]}
        for key, value in tensors.items():
            dst[key].copy_(value)

    part._set_main_param_and_optimizer_states = set_states


def _unshare_steps(optimizer: Any) -> None:
    """Give every parameter its own Adam `step` tensor: megatron restores one shared tensor, which
    torch's Adam would then increment once per parameter in place."""
    from asp_npu.trainer.memory import torch_optimizers

    for opt in torch_optimizers(optimizer):
        for state in opt.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].clone()


def _sharded_state(worker: Any, is_loading: bool) -> dict[str, Any]:
    if is_loading:
        _allocate_optimizer_state(worker.optimizer)
    model = worker.module.sharded_state_dict()
    return {"model": model,
            "optimizer": worker.optimizer.sharded_state_dict(model, is_loading=is_loading,
                                                             metadata=_OPT_METADATA)}


def save_checkpoint(directory: str | Path, worker: Any) -> Path:
    """Collective: every rank of the trainer calls it with the same directory."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    root = Path(directory)
    it = root / f"iter_{worker.step:07d}"
    if dist.get_rank() == 0:
        if it.exists():
            shutil.rmtree(it)
        (it / "dist").mkdir(parents=True)
    dist.barrier()
    dist_checkpointing.save(_sharded_state(worker, is_loading=False), str(it / "dist"))
    torch.save(_rng_state(), it / f"rng_rank{dist.get_rank()}.pt")
    dist.barrier()
    if dist.get_rank() == 0:
        lay = worker.layout
        atomic_write_json(root / "latest.json", {
            "schema": SCHEMA, "iteration": it.name, "step": worker.step, "policy_version": worker.version,
            "layout": {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp}, "model_path": str(worker.model_path),
            "use_distributed_optimizer": bool(worker.cfg.actor_config.use_distributed_optimizer)})
    dist.barrier()
    return it


def read_meta(directory: str | Path) -> dict[str, Any]:
    p = Path(directory) / "latest.json"
    if not p.is_file():
        raise ConfigError(f"actor_config.load: '{directory}' holds no trainer checkpoint (latest.json)")
    meta = json.loads(p.read_text())
    if meta.get("schema") != SCHEMA:
        raise ConfigError(f"{p}: schema {meta.get('schema')!r} is not {SCHEMA} (written by an older "
                          "asp-npu: export it to an HF folder and start from that)")
    return meta


def load_checkpoint(directory: str | Path, worker: Any) -> dict[str, Any]:
    """Restore model, optimizer, step and version into `worker` (any TP/PP/DP layout); RNG states
    too when the layout is the one the checkpoint was written with."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    meta = read_meta(directory)
    dist_opt = bool(worker.cfg.actor_config.use_distributed_optimizer)
    if meta["use_distributed_optimizer"] != dist_opt:
        raise ConfigError(f"checkpoint {directory} was written with use_distributed_optimizer="
                          f"{str(meta['use_distributed_optimizer']).lower()}; the trainer runs "
                          f"{str(dist_opt).lower()} (its optimizer state layouts differ)")
    it = Path(directory) / meta["iteration"]
    state = dist_checkpointing.load(_sharded_state(worker, is_loading=True), str(it / "dist"))
    worker.module.load_state_dict(state["model"], strict=True)
    worker.optimizer.load_state_dict(state["optimizer"])
    _unshare_steps(worker.optimizer)
    lay = worker.layout
    if meta["layout"] == {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp}:
        _set_rng_state(torch.load(it / f"rng_rank{dist.get_rank()}.pt", weights_only=False))
    worker.step = int(meta["step"])
    worker.version = int(meta["policy_version"])
    dist.barrier()
    return meta
