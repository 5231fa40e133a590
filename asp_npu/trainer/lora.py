"""LoRA adapters on megatron-core's tensor-parallel linear layers (MindSpeed-RL `grpo_lora`, verl LoRA).

A target layer keeps its weight W (frozen, `requires_grad=False`) and gains `lora_A` [r, in] and
`lora_B` [out, r]; its output becomes `x W^T + (alpha / r) x A^T B^T`. Under tensor parallelism the
adapter is split the way W is, so every rank's result equals TP=1's:

| layer (megatron) | W shard | lora_A | lora_B | what the adapter adds |
|---|---|---|---|---|
| ColumnParallelLinear (qkv, fc1) | rows | replicated | rows | A's gradient all-reduced over TP |
| RowParallelLinear (proj, fc2) | columns | columns | replicated | `x A_i^T` all-reduced over TP |

(A column layer's A gradient sums each rank's share of the outputs; a row layer's `x A_i^T` is a
partial sum over the input shards, as its base output is.)

With sequence parallelism the column layer's adapter gathers the sequence (reduce-scatter backward)
and the row layer's splits it again, exactly as the base layer does. The adapter runs as a forward
hook on the unchanged megatron module, so parameter names, the HF converter and recomputation are
untouched. Initialisation is PEFT's: A Kaiming-uniform (drawn whole from a seed per layer, then sliced,
so every layout starts from the same adapter), B zero.

- `attach(model, spec, seed)`: freeze the model, add the adapters, return the adapted layers.
- `merged_state(model)`: the model's state dict with `W + (alpha / r) B A` in place of each target W
  (per rank, in its own shard: the existing TP gather then yields the merged HF tensors).
- `adapter_only(sharded_state_dict)`: the checkpoint's model part restricted to the adapters.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

import torch

from asp_npu.config import LORA_TARGETS

# megatron module names MindSpeed-RL's `lora_target_modules` uses, and verl's / PEFT's HF names for them
TARGETS = LORA_TARGETS
HF_TO_TARGET = {"q_proj": "linear_qkv", "k_proj": "linear_qkv", "v_proj": "linear_qkv",
                "o_proj": "linear_proj", "gate_proj": "linear_fc1", "up_proj": "linear_fc1",
                "down_proj": "linear_fc2"}
_COLUMN = ("linear_qkv", "linear_fc1")


@dataclass(frozen=True)
class LoraSpec:
    r: int
    alpha: float
    targets: tuple[str, ...]

    @property
    def scale(self) -> float:
        return self.alpha / self.r

    @classmethod
    def from_actor(cls, act: Any) -> LoraSpec | None:
        """The spec `actor_config` asks for (None: no LoRA, `lora_r` 0 and no target modules)."""
        if not act.lora_r:
            return None
        return cls(int(act.lora_r), float(act.lora_alpha), tuple(act.lora_target_modules))


def _target_of(name: str, module: Any) -> str | None:
    """The target kind of a module (None: not a dense TP linear layer LoRA applies to)."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    leaf = name.rsplit(".", 1)[-1]
    if leaf not in TARGETS or getattr(module, "is_expert", False):
        return None
    want = ColumnParallelLinear if leaf in _COLUMN else RowParallelLinear
    return leaf if isinstance(module, want) else None


def _initial_a(key: str, seed: int, r: int, fan_in: int) -> torch.Tensor:
    """The whole lora_A of one layer: Kaiming-uniform (a = sqrt(5), PEFT's), the same on every rank."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))
    bound = 1.0 / math.sqrt(fan_in)
    return (torch.rand(r, fan_in, generator=gen, dtype=torch.float64) * 2 - 1).mul_(bound).float()


def _global_name(model: Any, name: str) -> str:
    """`decoder.layers.<local>.` -> the global layer index (stable across pipeline layouts)."""
    parts = name.split(".")
    if parts[:2] == ["decoder", "layers"]:
        parts[2] = str(int(model.decoder.layers[int(parts[2])].layer_number) - 1)
    return ".".join(parts)


def _add_adapter(module: Any, kind: str, key: str, spec: LoraSpec, seed: int) -> None:
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    w = module.weight
    fan_in = module.input_size
    a = _initial_a(key, seed, spec.r, fan_in)
    if kind in _COLUMN:  # A replicated, B split by rows like W
        module.lora_A = torch.nn.Parameter(a.to(w.dtype).to(w.device))
        module.lora_B = torch.nn.Parameter(torch.zeros(w.shape[0], spec.r, dtype=w.dtype, device=w.device))
        set_tensor_model_parallel_attributes(module.lora_B, True, 0, 1)
    else:  # A split by columns like W, B replicated
        a = torch.chunk(a, tp, dim=1)[rank].contiguous()
        module.lora_A = torch.nn.Parameter(a.to(w.dtype).to(w.device))
        module.lora_B = torch.nn.Parameter(torch.zeros(w.shape[0], spec.r, dtype=w.dtype, device=w.device))
        set_tensor_model_parallel_attributes(module.lora_A, True, 1, 1)
    module.lora_scale = spec.scale
    module.lora_kind = kind
    module.register_forward_hook(_column_hook if kind in _COLUMN else _row_hook)
    _patch_sharded_state_dict(module, {"weight": 0, "bias": 0, "lora_B": 0} if kind in _COLUMN
                              else {"weight": 1, "lora_A": 1})


def _column_hook(module: Any, args: tuple, out: tuple) -> tuple:
    from megatron.core.tensor_parallel import (
        copy_to_tensor_model_parallel_region,
        gather_from_sequence_parallel_region,
    )

    x = args[0]
    if module.sequence_parallel:  # [s/TP, b, h] -> [s, b, h]; backward reduce-scatters the partial grads
        x = gather_from_sequence_parallel_region(x, group=module.tp_group)
    else:  # backward all-reduces this rank's partial input gradient
        x = copy_to_tensor_model_parallel_region(x, group=module.tp_group)
    a = copy_to_tensor_model_parallel_region(module.lora_A, group=module.tp_group)  # grad summed over TP
    delta = (x @ a.t()) @ module.lora_B.t() * module.lora_scale
    output, bias = out
    return output + delta.to(output.dtype), bias


def _row_hook(module: Any, args: tuple, out: tuple) -> tuple:
    from megatron.core.tensor_parallel import (
        reduce_from_tensor_model_parallel_region,
        scatter_to_sequence_parallel_region,
    )

    h = reduce_from_tensor_model_parallel_region(args[0] @ module.lora_A.t(), group=module.tp_group)
    delta = (h @ module.lora_B.t()) * module.lora_scale
    if module.sequence_parallel:  # the row layer's output is this rank's sequence shard
        delta = scatter_to_sequence_parallel_region(delta, group=module.tp_group)
    output, bias = out
    return output + delta.to(output.dtype), bias


def _patch_sharded_state_dict(module: Any, axes: dict[str, int]) -> None:
    """Checkpoint the TP-split adapter matrix in global coordinates (megatron would store it as
    replicated otherwise)."""
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    def sharded_state_dict(prefix: str = "", sharded_offsets: tuple = (),
                           metadata: dict | None = None) -> Any:
        state = module.state_dict(prefix="", keep_vars=True)
        return make_sharded_tensors_for_checkpoint(state, prefix, axes, sharded_offsets,
                                                   tp_group=module.tp_group,
                                                   dp_cp_group=(metadata or {})["dp_cp_group"])

    module.sharded_state_dict = sharded_state_dict


def attach(model: Any, spec: LoraSpec, seed: int) -> list[str]:
    """Freeze every parameter of `model` and add adapters to its target layers; returns their names.

    Raises ConfigError when a target module matches no layer of this model (MoE experts, say)."""
    from asp_npu.errors import ConfigError

    model.requires_grad_(False)
    found: dict[str, list[str]] = {t: [] for t in spec.targets}
    for name, module in list(model.named_modules()):
        kind = _target_of(name, module)
        if kind in found:
            _add_adapter(module, kind, _global_name(model, name), spec, seed)
            found[kind].append(name)
    missing = [t for t, names in found.items() if not names and model.decoder.layers]
    if missing:
        raise ConfigError(f"actor_config.lora_target_modules: '{missing[0]}' matches no dense "
                          "tensor-parallel layer of this model (MoE experts take no adapter); use "
                          f"{'|'.join(TARGETS)}")
    return [n for names in found.values() for n in names]


def adapted_modules(model: Any) -> list[tuple[str, Any]]:
    return [(n, m) for n, m in model.named_modules() if hasattr(m, "lora_A")]


def delta(module: Any) -> torch.Tensor:
    """(alpha / r) B A in this rank's shard of the layer's weight, float32."""
    return (module.lora_B.detach().float() @ module.lora_A.detach().float()) * module.lora_scale


def merged_state(model: Any) -> dict[str, torch.Tensor]:
    """`model.state_dict()` with every adapted weight merged (W + (alpha / r) B A, W's dtype), adapters
    left out."""
    sd = {k: v for k, v in model.state_dict().items() if ".lora_" not in k}
    for name, module in adapted_modules(model):
        w = sd[f"{name}.weight"]
        sd[f"{name}.weight"] = (w.float() + delta(module)).to(w.dtype)
    return sd


def adapter_tensors(model: Any) -> dict[str, torch.Tensor]:
    """This rank's adapter parameters by name (local shards)."""
    return {k: v for k, v in model.state_dict().items() if ".lora_" in k}


def adapter_only(sharded: dict[str, Any]) -> dict[str, Any]:
    """The adapter entries of a model's sharded state dict (what a LoRA checkpoint stores)."""
    return {k: v for k, v in sharded.items() if ".lora_" in k}
