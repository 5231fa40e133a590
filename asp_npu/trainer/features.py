"""The actor's megatron training features: sequence parallelism and activation recomputation.

MindSpeed-RL's `actor_config` keys (`sequence_parallel`, `recompute_granularity`, `recompute_method`,
`recompute_num_layers`) map one to one onto megatron's TransformerConfig. Under sequence parallelism
norm weights see only this TP rank's slice of the sequence, so their gradients must be summed over
TP: megatron's `finalize_model_grads` does that for parameters marked `sequence_parallel`. Megatron's
plain-torch norm (`WrappedTorchNorm`, the local spec's norm when neither Transformer Engine nor apex
is installed) refuses sequence parallelism for want of that mark; `SequenceParallelNorm` is the same
torch norm with the mark, swapped into the layer spec only when sequence parallelism is on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from asp_npu.errors import ConfigError
from asp_npu.trainer.parallel import ModelDims


def feature_problems(dims: ModelDims, act: Any) -> list[str]:
    """Recompute settings this model's layer count cannot run (the rest is checked by config.validate)."""
    per_stage = dims.num_layers // max(1, act.pipeline_model_parallel_size)
    if act.recompute_granularity == "full" and not 1 <= act.recompute_num_layers <= max(1, per_stage):
        return [f"actor_config.recompute_num_layers={act.recompute_num_layers}: must be between 1 and the "
                f"{per_stage} layers per pipeline stage"]
    return []


def check_features(dims: ModelDims, act: Any) -> None:
    """Raise one ConfigError before any process group starts."""
    problems = feature_problems(dims, act)
    if problems:
        raise ConfigError("; ".join(problems))


def megatron_features(act: Any) -> dict[str, Any]:
    """TransformerConfig fields for the actor's sequence parallelism and activation recomputation."""
    out: dict[str, Any] = {"sequence_parallel": bool(act.sequence_parallel)}
    if act.recompute_granularity == "full":
        out.update(recompute_granularity="full", recompute_method=act.recompute_method or "uniform",
                   recompute_num_layers=act.recompute_num_layers)
    elif act.recompute_granularity == "selective":
        out["recompute_granularity"] = "selective"
    return out


class SequenceParallelNorm:
    """megatron's `WrappedTorchNorm` (torch RMSNorm/LayerNorm) whose weights carry the
    `sequence_parallel` mark, so their gradients are summed over TP."""

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                zero_centered_gamma: bool = False, normalization: str = "LayerNorm") -> Any:
        norm_cls = torch.nn.RMSNorm if config.normalization == "RMSNorm" else torch.nn.LayerNorm
        norm = norm_cls(normalized_shape=hidden_size, eps=eps)
        for p in norm.parameters():
            p.sequence_parallel = config.sequence_parallel
        return norm


def _swap_norms(node: Any) -> Any:
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    if node is WrappedTorchNorm:
        return SequenceParallelNorm
    if isinstance(node, ModuleSpec):
        return dataclasses.replace(node, module=_swap_norms(node.module),
                                   submodules=_swap_norms(node.submodules))
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return dataclasses.replace(node, **{f.name: _swap_norms(getattr(node, f.name))
                                            for f in dataclasses.fields(node) if f.init})
    if isinstance(node, list | tuple):
        return type(node)(_swap_norms(x) for x in node)
    return node


def block_spec(layer_spec: Any, config: Any) -> Any:
    """The transformer block spec for `layer_spec`: unchanged without sequence parallelism; with it,
    every plain-torch norm (layer norms, q/k norms, the final norm) swapped for `SequenceParallelNorm`."""
    if not config.sequence_parallel:
        return layer_spec
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    layer = _swap_norms(layer_spec)
    return TransformerBlockSubmodules(layer_specs=[layer] * get_num_layers_to_build(config),
                                      layer_norm=SequenceParallelNorm)
