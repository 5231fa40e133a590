"""Trainer checkpoints: model shard, optimizer, step, policy version and every RNG state.

Layout of `<dir>/`:
- `iter_<step>/model_tp<t>_pp<p>.pt` — model + optimizer of one model-parallel shard (written by its
  data-parallel rank 0 only: the other DP ranks hold identical copies);
- `iter_<step>/rng_rank<r>.pt` — each rank's RNG states (torch, numpy, python, megatron's tracker);
- `latest.json` — step, policy version and layout; written last, atomically, after a barrier, so a
  crash mid-save leaves the previous checkpoint as the one that loads.
Resuming requires the same TP/PP/DP layout (convert through an HF folder to change it).
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

SCHEMA = "asp-trainer-ckpt/1"


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


def save_checkpoint(directory: str | Path, worker: Any) -> Path:
    """Collective: every rank of the trainer calls it with the same directory."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    root = Path(directory)
    it = root / f"iter_{worker.step:07d}"
    if dist.get_rank() == 0:
        if it.exists():
            shutil.rmtree(it)
        it.mkdir(parents=True)
    dist.barrier()
    tp, pp = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    if ps.get_data_parallel_rank() == 0:
        torch.save({"model": worker.model.state_dict(), "optimizer": worker.optimizer.state_dict()},
                   it / f"model_tp{tp}_pp{pp}.pt")
    torch.save(_rng_state(), it / f"rng_rank{dist.get_rank()}.pt")
    dist.barrier()
    if dist.get_rank() == 0:
        lay = worker.layout
        atomic_write_json(root / "latest.json", {
            "schema": SCHEMA, "iteration": it.name, "step": worker.step, "policy_version": worker.version,
            "layout": {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp}, "model_path": str(worker.model_path)})
    dist.barrier()
    return it


def read_meta(directory: str | Path) -> dict[str, Any]:
    p = Path(directory) / "latest.json"
    if not p.is_file():
        raise ConfigError(f"actor_config.load: '{directory}' holds no trainer checkpoint (latest.json)")
    meta = json.loads(p.read_text())
    if meta.get("schema") != SCHEMA:
        raise ConfigError(f"{p}: schema {meta.get('schema')!r} is not {SCHEMA}")
    return meta


def load_checkpoint(directory: str | Path, worker: Any) -> dict[str, Any]:
    """Restore model, optimizer, step, version and RNG into `worker` (same layout required)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    meta = read_meta(directory)
    lay = worker.layout
    if meta["layout"] != {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp}:
        raise ConfigError(f"checkpoint {directory} was written with layout {meta['layout']}, "
                          f"the trainer runs tp={lay.tp} pp={lay.pp} dp={lay.dp}")
    it = Path(directory) / meta["iteration"]
    tp, pp = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    shard = torch.load(it / f"model_tp{tp}_pp{pp}.pt", map_location=worker.torch_device, weights_only=False)
    worker.model.load_state_dict(shard["model"], strict=True)
    worker.optimizer.load_state_dict(shard["optimizer"])
    _set_rng_state(torch.load(it / f"rng_rank{dist.get_rank()}.pt", weights_only=False))
    worker.step = int(meta["step"])
    worker.version = int(meta["policy_version"])
    dist.barrier()
    return meta
