"""The actor's megatron training features: sequence and context parallelism, activation recomputation.

MindSpeed-RL's `actor_config` keys (`sequence_parallel`, `recompute_granularity`, `recompute_method`,
`recompute_num_layers`) map one to one onto megatron's TransformerConfig. Under sequence parallelism
norm weights see only this TP rank's slice of the sequence, so their gradients must be summed over
TP: megatron's `finalize_model_grads` does that for parameters marked `sequence_parallel`. Megatron's
plain-torch norm (`WrappedTorchNorm`, the local spec's norm when neither Transformer Engine nor apex
is installed) refuses sequence parallelism for want of that mark; `SequenceParallelNorm` is the same
torch norm with the mark, swapped into the layer spec only when sequence parallelism is on. Context
parallelism swaps the local core attention for `context_parallel.ContextParallelAttention` the same way,
packed micro-batches (`use_remove_padding`) for `packing.PackedAttention`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from asp_npu.arch import ModelDims
from asp_npu.config import packing_problems
from asp_npu.errors import ConfigError


def feature_problems(dims: ModelDims, act: Any) -> list[str]:
    """Recompute settings this model's layer count cannot run, packing this model cannot honour (the
    rest is checked by config.validate)."""
    problems = packing_problems(act, dims.num_experts)
    per_stage = dims.num_layers // max(1, act.pipeline_model_parallel_size)
    if act.recompute_granularity == "full" and not 1 <= act.recompute_num_layers <= max(1, per_stage):
        problems.append(f"actor_config.recompute_num_layers={act.recompute_num_layers}: must be between 1 "
                        f"and the {per_stage} layers per pipeline stage")
    return problems


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


def swap_module(node: Any, old: type, new: Any) -> Any:
    """A copy of a megatron ModuleSpec tree with every `old` module class replaced by `new`."""
    from megatron.core.transformer.spec_utils import ModuleSpec

    if node is old:
        return new
    if isinstance(node, ModuleSpec):
        return dataclasses.replace(node, module=swap_module(node.module, old, new),
                                   submodules=swap_module(node.submodules, old, new))
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return dataclasses.replace(node, **{f.name: swap_module(getattr(node, f.name), old, new)
                                            for f in dataclasses.fields(node) if f.init})
    if isinstance(node, list | tuple):
        return type(node)(swap_module(x, old, new) for x in node)
    return node


def block_spec(layer_spec: Any, config: Any, cp_gather_attention: bool = True,
               packed_split_attention: bool = False) -> Any:
    """The transformer block spec for `layer_spec`: with context parallelism the core attention is
    `ContextParallelAttention` (unless the device stack attends across CP chunks itself:
    `device.DeviceSpec.cp_gather_attention`); for packed micro-batches (`packed_split_attention`) it is
    `packing.PackedAttention`; with sequence parallelism every plain-torch norm (layer
    norms, q/k norms, the final norm) is `SequenceParallelNorm`; otherwise `layer_spec` unchanged."""
    layer = layer_spec
    if config.context_parallel_size > 1 and cp_gather_attention:
        from megatron.core.transformer.dot_product_attention import DotProductAttention

        from asp_npu.trainer.context_parallel import ContextParallelAttention

        layer = swap_module(layer, DotProductAttention, ContextParallelAttention)
    elif packed_split_attention:
        from megatron.core.transformer.dot_product_attention import DotProductAttention

        from asp_npu.trainer.packing import PackedAttention

        layer = swap_module(layer, DotProductAttention, PackedAttention)
    if not config.sequence_parallel:
        return layer
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    layer = swap_module(layer, WrappedTorchNorm, SequenceParallelNorm)
    return TransformerBlockSubmodules(layer_specs=[layer] * get_num_layers_to_build(config),
                                      layer_norm=SequenceParallelNorm)
