"""HF <-> megatron-core weights (Qwen2/2.5, Qwen3, Qwen3-MoE, Llama 3): load an HF folder into the
sharded model, and gather the trained weights back to full HF-named tensors for the weight refresh.

Megatron layouts (per TP rank): `linear_qkv` rows are query groups, each [q heads of the group; k; v]
(so a TP shard is a contiguous run of whole groups); `linear_fc1` rows are [gate shard; up shard];
embedding/output rows and column-parallel outputs split over TP; `linear_proj`/`linear_fc2` split
their input dimension. Pipeline stages hold consecutive layers; the first holds the embedding, the
last the final norm and output layer (a copy of the embedding when weights are tied); a stage's
first layer index is megatron's own offset (`TransformerLayer.layer_number`, from
`get_transformer_layer_offset`), so uneven stages (`pipeline_model_parallel_layout`) convert too. Per-head
q/k RMSNorm weights (Qwen3) are replicated. MoE layers (HF checkpoint format: one
`mlp.experts.{e}.{gate,up,down}_proj` per expert, router `mlp.gate`) hold a replicated
`mlp.router.weight` and, on expert-parallel rank r, experts r*E/EP .. (r+1)*E/EP-1 as
`mlp.experts.local_experts.{j}`, each split over the expert tensor-parallel size (megatron's
default: TP; 1 with MindSpeed's moe_tp_extend_ep, whose TP x EP expert split is megatron's EP).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asp_npu.arch import ModelDims
from asp_npu.core.layout import ParallelLayout
from asp_npu.errors import ConfigError
from asp_npu.trainer.model import padded_vocab_size

_ATTN = "self_attention"


def read_hf_state(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of an HF folder (single or sharded safetensors, or pytorch_model.bin)."""
    from safetensors.torch import load_file

    p = Path(path)
    if (p / "model.safetensors").is_file():
        return load_file(str(p / "model.safetensors"))
    index = p / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        out: dict[str, torch.Tensor] = {}
        for f in files:
            out.update(load_file(str(p / f)))
        return out
    if (p / "pytorch_model.bin").is_file():
        return torch.load(p / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ConfigError(f"model.path: '{path}' holds no model.safetensors / pytorch_model.bin")


def _tp_chunk(t: torch.Tensor, tp: int, rank: int, dim: int = 0) -> torch.Tensor:
    return torch.chunk(t, tp, dim=dim)[rank].clone()


def _qkv_full(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dims: ModelDims) -> torch.Tensor:
    """HF q/k/v -> megatron's per-query-group interleaving [groups, (q_per_group + 2) * head_dim, ...]."""
    g, hd = dims.num_key_value_heads, dims.head_dim
    rest = q.shape[1:]
    qg = q.reshape(g, (dims.num_attention_heads // g) * hd, *rest)
    return torch.cat([qg, k.reshape(g, hd, *rest), v.reshape(g, hd, *rest)], dim=1)


def _qkv_split(qkv: torch.Tensor, dims: ModelDims) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, hd = dims.num_key_value_heads, dims.head_dim
    rest = qkv.shape[1:]
    grouped = qkv.reshape(g, -1, *rest)
    qn = (dims.num_attention_heads // g) * hd
    q, k, v = grouped[:, :qn], grouped[:, qn:qn + hd], grouped[:, qn + hd:]
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _pad_vocab(t: torch.Tensor, dims: ModelDims, tp: int) -> torch.Tensor:
    extra = padded_vocab_size(dims.vocab_size, tp) - t.shape[0]
    return torch.cat([t, t.new_zeros(extra, *t.shape[1:])]) if extra else t


def _mlp_to_megatron(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, prefix: str, tp: int,
                     tp_rank: int) -> dict[str, torch.Tensor]:
    fc1 = torch.cat([_tp_chunk(gate, tp, tp_rank), _tp_chunk(up, tp, tp_rank)])
    return {prefix + "linear_fc1.weight": fc1,
            prefix + "linear_fc2.weight": _tp_chunk(down, tp, tp_rank, 1)}


def local_experts(dims: ModelDims, ep: int, ep_rank: int) -> range:
    """Global expert indices held by expert-parallel rank `ep_rank` (megatron's even split)."""
    per = dims.num_experts // ep
    return range(ep_rank * per, (ep_rank + 1) * per)


def hf_layer_to_megatron(hf: Mapping[str, torch.Tensor], layer: int, local: int, dims: ModelDims,
                         tp: int, tp_rank: int, ep: int = 1, ep_rank: int = 0, etp: int | None = None,
                         etp_rank: int | None = None) -> dict[str, torch.Tensor]:
    """One transformer layer: HF tensors (global index `layer`) -> megatron local names (`local`)."""
    h, m = f"model.layers.{layer}.", f"decoder.layers.{local}."
    g_local = dims.num_key_value_heads // tp
    sl = slice(tp_rank * g_local, (tp_rank + 1) * g_local)
    attn = h + "self_attn."
    qkv_w = _qkv_full(hf[attn + "q_proj.weight"], hf[attn + "k_proj.weight"], hf[attn + "v_proj.weight"],
                      dims)
    out = {
        m + "input_layernorm.weight": hf[h + "input_layernorm.weight"].clone(),
        m + f"{_ATTN}.linear_qkv.weight": qkv_w[sl].reshape(-1, dims.hidden_size).clone(),
        m + f"{_ATTN}.linear_proj.weight": _tp_chunk(hf[attn + "o_proj.weight"], tp, tp_rank, 1),
        m + "pre_mlp_layernorm.weight": hf[h + "post_attention_layernorm.weight"].clone(),
    }
    if dims.qkv_bias:
        qkv_b = _qkv_full(hf[attn + "q_proj.bias"], hf[attn + "k_proj.bias"], hf[attn + "v_proj.bias"], dims)
        out[m + f"{_ATTN}.linear_qkv.bias"] = qkv_b[sl].reshape(-1).clone()
    if dims.qk_norm:
        out[m + f"{_ATTN}.q_layernorm.weight"] = hf[attn + "q_norm.weight"].clone()
        out[m + f"{_ATTN}.k_layernorm.weight"] = hf[attn + "k_norm.weight"].clone()
    if not dims.num_experts:
        out.update(_mlp_to_megatron(hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"],
                                    hf[h + "mlp.down_proj.weight"], m + "mlp.", tp, tp_rank))
        return out
    out[m + "mlp.router.weight"] = hf[h + "mlp.gate.weight"].clone()
    for j, e in enumerate(local_experts(dims, ep, ep_rank)):
        x = f"{h}mlp.experts.{e}."
        out.update(_mlp_to_megatron(hf[x + "gate_proj.weight"], hf[x + "up_proj.weight"],
                                    hf[x + "down_proj.weight"], f"{m}mlp.experts.local_experts.{j}.",
                                    tp if etp is None else etp, tp_rank if etp_rank is None else etp_rank))
    return out


def stage_layers(dims: ModelDims, layout: ParallelLayout, pp_rank: int) -> range:
    """Global layer indices held by pipeline stage `pp_rank` (even, or `layout.stages`)."""
    return layout.stage_layers(dims.num_layers, pp_rank)


def megatron_layers(model: torch.nn.Module) -> range:
    """Global indices of this stage's decoder layers as megatron numbered them (layer_number is
    1-based and includes `get_transformer_layer_offset`)."""
    layers = model.decoder.layers
    first = int(layers[0].layer_number) - 1 if len(layers) else 0
    return range(first, first + len(layers))


def hf_to_megatron(hf: Mapping[str, torch.Tensor], dims: ModelDims, layout: ParallelLayout, tp_rank: int,
                   pp_rank: int, ep_rank: int = 0, etp_rank: int | None = None,
                   layers: range | None = None) -> dict[str, torch.Tensor]:
    """The megatron state-dict entries of rank (tp_rank, pp_rank, ep_rank) from full HF tensors.

    Experts are split over the expert tensor-parallel size (`etp_rank`: None = tp_rank, megatron's
    default ETP = TP). `layers`: this stage's global layer indices (default: from the layout)."""
    tp, pp = layout.tp, layout.pp
    etp = layout.expert_tp
    out: dict[str, torch.Tensor] = {}
    embed = _pad_vocab(hf["model.embed_tokens.weight"], dims, tp)
    if pp_rank == 0:
        out["embedding.word_embeddings.weight"] = _tp_chunk(embed, tp, tp_rank)
    for local, layer in enumerate(layers if layers is not None else stage_layers(dims, layout, pp_rank)):
        out.update(hf_layer_to_megatron(hf, layer, local, dims, tp, tp_rank, layout.ep, ep_rank, etp,
                                        tp_rank if etp_rank is None else etp_rank))
    if pp_rank == pp - 1:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"].clone()
        if not dims.tie_word_embeddings:
            out["output_layer.weight"] = _tp_chunk(_pad_vocab(hf["lm_head.weight"], dims, tp), tp, tp_rank)
        elif pp > 1:
            out["output_layer.weight"] = _tp_chunk(embed, tp, tp_rank)
    return out


def load_hf_into_model(model: torch.nn.Module, hf: Mapping[str, torch.Tensor], dims: ModelDims,
                       layout: ParallelLayout) -> None:
    """Copy full HF tensors into this rank's shard; every parameter must be covered."""
    from megatron.core import parallel_state as ps

    local = hf_to_megatron(hf, dims, layout, ps.get_tensor_model_parallel_rank(),
                           ps.get_pipeline_model_parallel_rank(), ps.get_expert_model_parallel_rank(),
                           ps.get_expert_tensor_parallel_rank(), megatron_layers(model))
    own = model.state_dict()
    for name, t in local.items():
        if name not in own:
            raise RuntimeError(f"converter produced '{name}', which the megatron model does not have")
        if own[name].shape != t.shape:
            raise RuntimeError(f"{name}: megatron shape {tuple(own[name].shape)} != HF {tuple(t.shape)}")
    missing = [k for k in own if k not in local and not k.endswith("_extra_state")]
    if missing:
        raise RuntimeError(f"HF weights do not cover megatron parameters: {missing[:5]}")
    with torch.no_grad():
        for name, t in local.items():
            own[name].copy_(t.to(own[name].dtype))


def _gather(t: torch.Tensor, group: Any, size: int) -> list[torch.Tensor]:
    import torch.distributed as dist

    if size == 1:
        return [t]
    parts = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return parts


def _tp_gather(t: torch.Tensor) -> list[torch.Tensor]:
    from megatron.core import parallel_state as ps

    return _gather(t, ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_world_size())


def _mlp_to_hf(sd: Mapping[str, torch.Tensor], m: str, h: str, gather: Any) -> dict[str, torch.Tensor]:
    fc1 = gather(sd[m + "linear_fc1.weight"])
    return {h + "gate_proj.weight": torch.cat([p.chunk(2)[0] for p in fc1]),
            h + "up_proj.weight": torch.cat([p.chunk(2)[1] for p in fc1]),
            h + "down_proj.weight": torch.cat(gather(sd[m + "linear_fc2.weight"]), dim=1)}


def _experts_to_hf(sd: Mapping[str, torch.Tensor], m: str, h: str,
                   dims: ModelDims) -> dict[str, torch.Tensor]:
    """Every expert of one MoE layer: gathered over expert TP, then over the expert-parallel ranks."""
    from megatron.core import parallel_state as ps

    def etp_gather(t: torch.Tensor) -> list[torch.Tensor]:
        return _gather(t, ps.get_expert_tensor_parallel_group(), ps.get_expert_tensor_parallel_world_size())

    ep = ps.get_expert_model_parallel_world_size()
    n_local = dims.num_experts // ep
    mine = [_mlp_to_hf(sd, f"{m}local_experts.{j}.", "", etp_gather) for j in range(n_local)]
    out: dict[str, torch.Tensor] = {}
    for name in ("gate_proj.weight", "up_proj.weight", "down_proj.weight"):
        local = torch.stack([e[name] for e in mine])
        for r, part in enumerate(_gather(local, ps.get_expert_model_parallel_group(), ep)):
            for j in range(n_local):
                out[f"{h}experts.{r * n_local + j}.{name}"] = part[j]
    return out


def megatron_stage_to_hf(model: torch.nn.Module, dims: ModelDims,
                         tensors: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Full HF tensors of this pipeline stage (TP/EP all-gather; every TP rank of the stage gets them).

    `tensors` (megatron names -> local tensors, e.g. the gradients) replaces the model's weights;
    `model` still says which layers this stage holds."""
    from megatron.core import parallel_state as ps

    pp, pp_rank = ps.get_pipeline_model_parallel_world_size(), ps.get_pipeline_model_parallel_rank()
    src = model.state_dict() if tensors is None else tensors
    sd = {k: v.detach() for k, v in src.items() if not k.endswith("_extra_state")}
    return _stage_to_hf(sd, dims, megatron_layers(model), pp_rank == 0, pp_rank == pp - 1, _tp_gather,
                        lambda m, h: _experts_to_hf(sd, m, h, dims))


def full_megatron_to_hf(sd: Mapping[str, torch.Tensor], dims: ModelDims) -> dict[str, torch.Tensor]:
    """HF tensors from a whole model in megatron names at TP=1 (global layer and expert indices,
    `mlp.experts.local_experts.{e}` for every expert e): what a Megatron checkpoint merges to."""

    def one(t: torch.Tensor) -> list[torch.Tensor]:
        return [t]

    def experts(m: str, h: str) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for e in range(dims.num_experts):
            out.update(_mlp_to_hf(sd, f"{m}local_experts.{e}.", f"{h}experts.{e}.", one))
        return out

    return _stage_to_hf(sd, dims, range(dims.num_layers), True, True, one, experts)


def _stage_to_hf(sd: Mapping[str, torch.Tensor], dims: ModelDims, layers: range, first: bool, last: bool,
                 gather: Any, experts: Any) -> dict[str, torch.Tensor]:
    """HF tensors of one pipeline stage: `gather` returns a TP-sharded tensor's shards in rank order;
    `experts(megatron prefix, HF prefix)` the HF tensors of one MoE layer's experts."""
    out: dict[str, torch.Tensor] = {}
    V = dims.vocab_size
    if first:
        out["model.embed_tokens.weight"] = torch.cat(gather(sd["embedding.word_embeddings.weight"]))[:V]
    for local, layer in enumerate(layers):
        m, h = f"decoder.layers.{local}.", f"model.layers.{layer}."
        kinds = ("weight", "bias") if dims.qkv_bias else ("weight",)
        for kind in kinds:
            q, k, v = _qkv_split(torch.cat(gather(sd[m + f"{_ATTN}.linear_qkv.{kind}"])), dims)
            out[h + f"self_attn.q_proj.{kind}"] = q
            out[h + f"self_attn.k_proj.{kind}"] = k
            out[h + f"self_attn.v_proj.{kind}"] = v
        if dims.qk_norm:
            out[h + "self_attn.q_norm.weight"] = sd[m + f"{_ATTN}.q_layernorm.weight"].clone()
            out[h + "self_attn.k_norm.weight"] = sd[m + f"{_ATTN}.k_layernorm.weight"].clone()
        out[h + "self_attn.o_proj.weight"] = torch.cat(gather(sd[m + f"{_ATTN}.linear_proj.weight"]), 1)
        if dims.num_experts:
            out[h + "mlp.gate.weight"] = sd[m + "mlp.router.weight"].clone()
            out.update(experts(m + "mlp.experts.", h + "mlp."))
        else:
            out.update(_mlp_to_hf(sd, m + "mlp.", h + "mlp.", gather))
        out[h + "input_layernorm.weight"] = sd[m + "input_layernorm.weight"].clone()
        out[h + "post_attention_layernorm.weight"] = sd[m + "pre_mlp_layernorm.weight"].clone()
    if last:
        out["model.norm.weight"] = sd["decoder.final_layernorm.weight"].clone()
        if not dims.tie_word_embeddings:
            out["lm_head.weight"] = torch.cat(gather(sd["output_layer.weight"]))[:V]
    return out


def to_numpy(tensors: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """float32 numpy copies (numpy pickles fast through Ray; torch tensors do not)."""
    return {k: v.detach().to(torch.float32).cpu().numpy() for k, v in tensors.items()}


def load_safetensors_bytes(blob: bytes) -> dict[str, Any]:
    """Inverse of HFWeights.to_safetensors_bytes (tests, receivers without vLLM)."""
    from safetensors.torch import load

    return dict(load(blob))
