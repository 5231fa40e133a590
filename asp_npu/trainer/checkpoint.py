"""Trainer checkpoints through megatron-core's `dist_checkpointing`: reshardable across TP/PP/DP.

Layout of `<dir>/`:
- `iter_<step>/dist/` — the sharded state dict of the model and the optimizer (Adam moments, fp32
  master weights, step), saved by every rank in parallel; each tensor is stored in its global
  (unsharded) coordinates, so it loads into any TP/PP/DP layout of the same model (the distributed
  optimizer's state in megatron's `fully_reshardable` form);
- `iter_<step>/rng_rank<r>.pt` — each rank's RNG states (torch, numpy, python, megatron's tracker),
  restored when the layout is unchanged (dropout is off, so a resharded resume does not depend on them);
- `iter_<step>/trainer.json` — step, policy version, layout, optimizer kind and the lr schedule's
  position (megatron's `OptimizerParamScheduler.state_dict`): written (temp + fsync +
  rename) by rank 0 once every rank has written and fsync'd its shards, so it marks a complete iteration;
- `iter_<step>/pipeline.pkl` — the pipeline's state (queue, ledger, data position, predictor), written
  by the driver (`asp_npu.pipeline.resume`);
- `latest.json` — the pointer: the complete iteration to load, moved atomically only after all of the
  above, so a crash mid-save leaves the previous checkpoint as the one that loads. Nothing is deleted
  but a partial folder of the step being saved.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from asp_npu.errors import ConfigError, UserError
from asp_npu.io import atomic_write_json, fsync_dir, read_json_file

SCHEMA = "asp-trainer-ckpt/3"
POINTER = "latest.json"
TRAINER_META = "trainer.json"


def _rng_state() -> dict[str, Any]:
    import torch
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "tracker": {k: v.clone() for k, v in get_cuda_rng_tracker().get_states().items()}}


def _set_rng_state(state: dict[str, Any]) -> None:
    import torch
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

    def set_states(model_param: Any, tensors: dict[str, Any]) -> None:
        group, order = part.model_param_group_index_map[model_param]
        main = part.optimizer.param_groups[group]["params"][order]
        dst = {"param": main, **part.optimizer.state[main]}
        for key, value in tensors.items():
            dst[key].copy_(value)

    part._set_main_param_and_optimizer_states = set_states


def _unshare_steps(optimizer: Any) -> None:
    """Give every parameter its own Adam `step` tensor: megatron restores one shared tensor, which
    torch's Adam would then increment once per parameter in place."""
    import torch

    from asp_npu.trainer.memory import torch_optimizers

    for opt in torch_optimizers(optimizer):
        for state in opt.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].clone()


def _sharded_state(worker: Any, is_loading: bool) -> dict[str, Any]:
    if is_loading:
        _allocate_optimizer_state(worker.optimizer)
    model = worker.module.sharded_state_dict()
    if getattr(worker, "lora", None) is not None:  # LoRA: the frozen base comes from model.path
        from asp_npu.trainer.lora import adapter_only

        model = adapter_only(model)
    return {"model": model,
            "optimizer": worker.optimizer.sharded_state_dict(model, is_loading=is_loading,
                                                             metadata=_OPT_METADATA)}


def _committed(root: Path) -> str | None:
    """The iteration the pointer names (None: no readable pointer)."""
    try:
        return str(json.loads((root / POINTER).read_text())["iteration"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _fsync_tree(folder: Path) -> None:
    """fsync every file under `folder` and the folders themselves (shards survive a power loss)."""
    for dirpath, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def save_checkpoint(directory: str | Path, worker: Any, commit: bool = True) -> Path:
    """Collective: every rank of the trainer calls it with the same directory.

    The shards go to a fresh `iter_<step>/` (a leftover partial one of the same step, never the
    committed one, is cleared first); every rank fsyncs what it wrote; rank 0 then writes the
    iteration's `trainer.json` (it is complete) and, with `commit`, moves the pointer `latest.json`
    (temp + fsync + rename). Without `commit` the caller adds its own files and calls `commit`."""
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    root = Path(directory)
    it = root / f"iter_{worker.step:07d}"
    rank = dist.get_rank()
    done = _committed(root) == it.name and (it / TRAINER_META).is_file()  # this state is saved already
    dist.barrier()
    if not done:
        if rank == 0:
            if it.exists():
                shutil.rmtree(it)  # an uncommitted partial save of this step
            (it / "dist").mkdir(parents=True)
        dist.barrier()
        dist_checkpointing.save(_sharded_state(worker, is_loading=False), str(it / "dist"))
        torch.save(_rng_state(), it / f"rng_rank{rank}.pt")
        _fsync_tree(it)
        dist.barrier()
    if rank == 0:
        lay = worker.layout
        if not done:
            atomic_write_json(it / TRAINER_META, {
                "schema": SCHEMA, "iteration": it.name, "step": worker.step,
                "policy_version": worker.version, "layout": layout_meta(lay),
                "model_path": str(worker.model_path),
                "kl_coef": float(worker.kl_ctrl.value),  # the adaptive KL controller's position
                "use_distributed_optimizer": bool(worker.cfg.actor_config.use_distributed_optimizer),
                "lora": _lora_meta(worker),
                "lr_scheduler": worker.scheduler.state_dict()})
        if commit:
            commit_checkpoint(root, it)
    dist.barrier()
    return it


def _lora_meta(worker: Any) -> dict[str, Any] | None:
    """The LoRA a checkpoint's adapters belong to (None: a whole-model checkpoint)."""
    spec = getattr(worker, "lora", None)
    return None if spec is None else {"r": spec.r, "alpha": spec.alpha, "targets": list(spec.targets)}


def layout_meta(lay: Any) -> dict[str, int]:
    """The parallel layout a checkpoint records (RNG states are only restored into the same one)."""
    return {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "cp": lay.cp}


def commit_checkpoint(root: str | Path, iteration: str | Path, **extra: Any) -> Path:
    """Point `<root>/latest.json` at a complete iteration (atomic: the old pointer or the new one)."""
    it = Path(root) / Path(iteration).name
    meta = read_json_file(it / TRAINER_META, "trainer checkpoint metadata")
    return atomic_write_json(Path(root) / POINTER, {**meta, **extra})


def complete_iterations(root: str | Path) -> list[Path]:
    """Iteration folders under `root` whose trainer part is complete, oldest first."""
    r = Path(root)
    return sorted(p for p in r.glob("iter_*") if (p / TRAINER_META).is_file()) if r.is_dir() else []


def read_meta(directory: str | Path) -> dict[str, Any]:
    """The checkpoint `actor_config.load` names: a folder with a `latest.json` pointer, or one complete
    `iter_<step>` folder. A torn pointer, or one naming an incomplete iteration, is refused with one
    line that names the newest complete iteration to load instead (never a silent fallback: the
    steps after it would be trained again)."""
    d = Path(directory)
    pointer = d / POINTER
    if not pointer.is_file() and (d / TRAINER_META).is_file():
        meta, it = _trainer_meta(d), d
    elif not pointer.is_file():
        raise ConfigError(f"actor_config.load: '{directory}' holds no trainer checkpoint (latest.json)")
    else:
        good = complete_iterations(d)
        instead = (f"; the newest complete one is {good[-1]} (actor_config.load={good[-1]})" if good
                   else "; no complete iteration is left")
        try:
            meta = read_json_file(pointer, "checkpoint pointer")
            it = d / str(meta["iteration"])
        except (UserError, KeyError, TypeError) as exc:
            raise ConfigError(f"{pointer}: torn or unreadable checkpoint pointer ({exc}){instead}") from None
        if not (it / TRAINER_META).is_file():
            raise ConfigError(f"{pointer} names {it}, which is incomplete or missing{instead}")
        _trainer_meta(it, it.name)  # the iteration's own record is sound too
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
        got = meta.get("schema") if isinstance(meta, dict) else meta
        raise ConfigError(f"{it}: schema {got!r} is not {SCHEMA} (written by an older "
                          "asp-npu: `asp-npu export-hf` writes its weights as an HF folder to start from)")
    problem = meta_problem(meta)
    if problem:
        raise ConfigError(f"{it / TRAINER_META}: {problem}")
    return {**meta, "path": str(it)}


def _trainer_meta(it: Path, name: str | None = None) -> dict[str, Any]:
    """`it/trainer.json`, parsed and schema-checked (ConfigError naming it: resume reports those)."""
    f = it / TRAINER_META
    try:
        meta = read_json_file(f, "trainer checkpoint metadata")
    except UserError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(meta, dict):
        raise ConfigError(f"{f}: expected a JSON object, got {type(meta).__name__}")
    if meta.get("schema") == SCHEMA:
        problem = meta_problem(meta, name)
        if problem:
            raise ConfigError(f"{f}: {problem}")
    return meta


def meta_problem(meta: dict[str, Any], name: str | None = None) -> str | None:
    """What is wrong with a checkpoint's trainer.json (None: the fields the resume reads are sound):
    `step` and `iteration` are required (`name`: the folder the pointer named, which it must match);
    `policy_version`, `layout` and `use_distributed_optimizer` are checked where present."""
    for key in ("step", "policy_version"):
        v = meta.get(key)
        if key in meta and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            return f"'{key}' is {v!r}, expected an integer >= 0"
    if "step" not in meta:
        return "no 'step'"
    if not isinstance(meta.get("iteration"), str) or (name is not None and meta["iteration"] != name):
        return f"'iteration' is {meta.get('iteration')!r}, expected {name or 'the folder name'!r}"
    lay = meta.get("layout", {"tp": 1, "pp": 1, "dp": 1})
    if not isinstance(lay, dict) or not all(isinstance(lay.get(k), int) and not isinstance(lay.get(k), bool)
                                            and lay[k] >= 1 for k in ("tp", "pp", "dp")):
        return f"'layout' is {lay!r}, expected {{tp, pp, dp}} integers >= 1"
    if not isinstance(meta.get("use_distributed_optimizer", False), bool):
        return "'use_distributed_optimizer' is not true|false"
    return None


def load_checkpoint(directory: str | Path, worker: Any) -> dict[str, Any]:
    """Restore model, optimizer, step and version into `worker` (any TP/PP/CP/DP layout); RNG states
    too when the layout is the one the checkpoint was written with."""
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    meta = read_meta(directory)
    dist_opt = bool(worker.cfg.actor_config.use_distributed_optimizer)
    if meta["use_distributed_optimizer"] != dist_opt:
        raise ConfigError(f"checkpoint {directory} was written with use_distributed_optimizer="
                          f"{str(meta['use_distributed_optimizer']).lower()}; the trainer runs "
                          f"{str(dist_opt).lower()} (its optimizer state layouts differ)")
    if meta.get("lora") != _lora_meta(worker):  # adapters-only vs whole-model checkpoints
        raise ConfigError(f"checkpoint {directory} was written with LoRA {meta.get('lora')}; the trainer "
                          f"runs LoRA {_lora_meta(worker)} (actor_config.lora_r, lora_alpha, "
                          "lora_target_modules)")
    it = Path(meta["path"])
    # megatron's HybridDeviceOptimizer (optimizer_cpu_offload) keeps its sub-optimizer classes in its
    # param groups, so they are in the saved common state: let torch's safe loader accept those two
    with torch.serialization.safe_globals([torch.optim.AdamW, torch.optim.SGD]):
        state = dist_checkpointing.load(_sharded_state(worker, is_loading=True), str(it / "dist"))
    worker.module.load_state_dict(state["model"], strict=getattr(worker, "lora", None) is None)
    worker.optimizer.load_state_dict(state["optimizer"])
    _unshare_steps(worker.optimizer)
    if {"cp": 1, **meta["layout"]} == layout_meta(worker.layout):  # checkpoints before CP lack "cp"
        _set_rng_state(torch.load(it / f"rng_rank{dist.get_rank()}.pt", weights_only=False))
    if "lr_scheduler" in meta:  # the schedule's position; its values are the config's
        worker.scheduler.load_state_dict(meta["lr_scheduler"])
    worker.step = int(meta["step"])
    worker.version = int(meta["policy_version"])
    if "kl_coef" in meta:  # checkpoints before the KL controller lack it: kl_coef from the config
        worker.kl_ctrl.value = float(meta["kl_coef"])
    dist.barrier()
    return meta
