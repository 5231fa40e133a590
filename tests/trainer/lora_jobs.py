"""Multi-rank jobs for the LoRA tests (run in spawned processes by `helpers.run_ranks`)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from tests.trainer.helpers import make_batch, trainer_config

LORA = {"lora_r": 4, "lora_alpha": 8.0,
        "lora_target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]}


def _base_digest(module: Any) -> str:
    """sha256 over the bytes of every non-adapter parameter and buffer of this rank."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        if ".lora_" not in name and not name.endswith("_extra_state"):
            h.update(name.encode())
            h.update(t.detach().contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()


def _full_adapter_grads(worker: Any) -> dict[str, Any]:
    """Every adapter's reduced gradient (main_grad) in full, TP=1 shapes: split matrices gathered."""
    from asp_npu.trainer.convert import _tp_gather

    out: dict[str, Any] = {}
    for name, p in worker.module.named_parameters():
        if ".lora_" not in name:
            continue
        g = p.main_grad.detach().clone()
        if getattr(p, "tensor_model_parallel", False):
            dim = p.partition_dim
            parts = _tp_gather(g)
            if name.endswith("lora_B") and ".linear_fc1." in name:  # [gate shard; up shard] per rank
                parts = [x.chunk(2)[i] for i in range(2) for x in parts]
            g = __import__("torch").cat(parts, dim=dim)
        out[name] = g.numpy()
    return out


def lora_training(rank: int, world: int, port: int, model_dir: str, setups: dict[str, dict[str, Any]],
                  steps: int = 3) -> dict[str, Any]:
    """For each setup (actor_config fields on top of LORA): base digest before/after `steps` GRPO steps,
    adapter gradients before every optimizer step, losses, trainable names, the merged HF weights."""
    from asp_npu.trainer.worker import TrainerWorker

    out: dict[str, Any] = {}
    for name, fields in setups.items():
        cfg = trainer_config(Path(model_dir))
        for k, v in {**LORA, **fields}.items():
            setattr(cfg.actor_config, k, v)
        w = TrainerWorker(cfg, rank, world, master_port=port)
        before = _base_digest(w.module)
        adapters_before = {k: v.clone() for k, v in w.module.state_dict().items() if ".lora_" in k}
        grads: list[dict[str, Any]] = []
        step = w.optimizer.step

        def capturing_step(w: Any = w, step: Any = step, grads: list = grads) -> Any:
            grads.append(_full_adapter_grads(w))
            return step()

        w.optimizer.step = capturing_step
        metrics = [w.train_step(make_batch(seed=i)) for i in range(steps)]
        moved = {k: float((v - adapters_before[k]).abs().max())
                 for k, v in w.module.state_dict().items() if ".lora_" in k}
        hf = w.get_hf_weights()
        out[name] = {"base_before": before, "base_after": _base_digest(w.module),
                     "adapter_moved": moved, "grads": grads,
                     "losses": [m["loss"] for m in metrics], "grad_norms": [m["grad_norm"] for m in metrics],
                     "trainable": sorted(n for n, p in w.module.named_parameters() if p.requires_grad),
                     "optimizer_params": sum(len(g["params"]) for g in w.optimizer.param_groups),
                     "bytes": w.allocated_bytes(),
                     "merged": hf.tensors if hf is not None else None}
    return out
