"""What one trainer rank holds in device memory, measured from the live megatron objects.

`allocated_bytes` is the ground truth the memory estimator of `asp-npu check` is validated against:
it counts each distinct tensor storage once (megatron's DDP keeps gradients, and with the
distributed optimizer also the weights, in contiguous buffers that parameters view), so the figures
are the bytes actually allocated, bucket padding included.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch


def _sid(t: torch.Tensor) -> int:
    """Identity of the storage behind `t` (stable while the storage is released by offload)."""
    return int(t.untyped_storage()._cdata)


def _unique(tensors: Iterable[torch.Tensor], exclude: set[int] | None = None) -> dict[int, torch.Tensor]:
    out: dict[int, torch.Tensor] = {}
    for t in tensors:
        sid = _sid(t)
        if exclude and sid in exclude:
            continue
        out.setdefault(sid, t)
    return out


def torch_optimizers(optimizer: Any) -> list[Any]:
    """The torch optimizers inside a megatron optimizer (one per chained part)."""
    parts = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return [p.optimizer for p in parts if getattr(p, "optimizer", None) is not None]


def weight_tensors(model: Any) -> list[torch.Tensor]:
    """The model's parameters (views of DDP's param buffer when the distributed optimizer is on)."""
    return list(model.parameters())


def grad_tensors(model: Any) -> list[torch.Tensor]:
    """DDP's contiguous gradient buffers (`param.main_grad` views them)."""
    buffers = list(getattr(model, "buffers", [])) + list(getattr(model, "expert_parallel_buffers", []))
    return [b.grad_data for b in buffers if getattr(b, "grad_data", None) is not None]


def optimizer_tensors(model: Any, optimizer: Any) -> list[torch.Tensor]:
    """Adam moments and fp32 master weights that are not the model's own storage (fp32 training
    steps the weights in place, so its master copies are the weights and count there)."""
    weights = set(_unique(weight_tensors(model)))

    def walk() -> Iterator[torch.Tensor]:
        for opt in torch_optimizers(optimizer):
            for group in opt.param_groups:
                yield from (p for p in group["params"] if isinstance(p, torch.Tensor))
            for state in opt.state.values():
                yield from (v for v in state.values() if isinstance(v, torch.Tensor))

    return list(_unique(walk(), exclude=weights).values())


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.untyped_storage().nbytes() for t in _unique(tensors).values())


def allocated_bytes(model: Any, optimizer: Any) -> dict[str, int]:
    """Per-rank device bytes of this rank's `weights`, `grads` and `optimizer` state (Adam moments +
    fp32 master weights not shared with the model), each distinct storage once; storages moved to
    host by offload count 0 here."""
    return {"weights": _nbytes(weight_tensors(model)), "grads": _nbytes(grad_tensors(model)),
            "optimizer": _nbytes(optimizer_tensors(model, optimizer))}
