"""HF <-> megatron-core weights for Qwen2/Qwen2.5: load an HF folder into the sharded model, and
gather the trained weights back to full HF-named tensors for the rollout weight refresh.

Megatron layouts (per TP rank): `linear_qkv` rows are query groups, each [q heads of the group; k; v]
(so a TP shard is a contiguous run of whole groups); `linear_fc1` rows are [gate shard; up shard];
embedding/output rows and column-parallel outputs split over TP; `linear_proj`/`linear_fc2` split
their input dimension. Pipeline stages hold consecutive layers; the first holds the embedding, the
last the final norm and output layer (a copy of the embedding when weights are tied).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asp_npu.errors import ConfigError
from asp_npu.trainer.model import padded_vocab_size
from asp_npu.trainer.parallel import Layout, ModelDims

_ATTN = "self_attention"


@dataclass
class HFWeights:
    """Full HF-named weights of one policy version (what a weight refresh ships to the instances)."""

    version: int
    tensors: dict[str, np.ndarray] = field(default_factory=dict)

    def to_safetensors_bytes(self, dtype: str = "float32") -> bytes:
        """safetensors bytes of the tensors in `dtype` (vLLM's reload_weights reads these)."""
        from safetensors.torch import save

        from asp_npu.trainer.model import DTYPES

        return save({k: torch.from_numpy(np.array(v)).to(DTYPES[dtype]) for k, v in self.tensors.items()},
                    metadata={"policy_version": str(self.version)})

    @property
    def num_bytes(self) -> int:
        return int(sum(v.nbytes for v in self.tensors.values()))


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
    g, hd = dims.num_kv_heads, dims.head_dim
    rest = q.shape[1:]
    qg = q.reshape(g, (dims.num_heads // g) * hd, *rest)
    return torch.cat([qg, k.reshape(g, hd, *rest), v.reshape(g, hd, *rest)], dim=1)


def _qkv_split(qkv: torch.Tensor, dims: ModelDims) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, hd = dims.num_kv_heads, dims.head_dim
    rest = qkv.shape[1:]
    grouped = qkv.reshape(g, -1, *rest)
    qn = (dims.num_heads // g) * hd
    q, k, v = grouped[:, :qn], grouped[:, qn:qn + hd], grouped[:, qn + hd:]
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _pad_vocab(t: torch.Tensor, dims: ModelDims, tp: int) -> torch.Tensor:
    extra = padded_vocab_size(dims.vocab_size, tp) - t.shape[0]
    return torch.cat([t, t.new_zeros(extra, *t.shape[1:])]) if extra else t


def hf_layer_to_megatron(hf: Mapping[str, torch.Tensor], layer: int, local: int, dims: ModelDims,
                         tp: int, tp_rank: int) -> dict[str, torch.Tensor]:
    """One transformer layer: HF tensors (global index `layer`) -> megatron local names (`local`)."""
    h, m = f"model.layers.{layer}.", f"decoder.layers.{local}."
    g_local = dims.num_kv_heads // tp
    qkv_w = _qkv_full(hf[h + "self_attn.q_proj.weight"], hf[h + "self_attn.k_proj.weight"],
                      hf[h + "self_attn.v_proj.weight"], dims)
    qkv_b = _qkv_full(hf[h + "self_attn.q_proj.bias"], hf[h + "self_attn.k_proj.bias"],
                      hf[h + "self_attn.v_proj.bias"], dims)
    sl = slice(tp_rank * g_local, (tp_rank + 1) * g_local)
    gate, up = hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]
    return {
        m + "input_layernorm.weight": hf[h + "input_layernorm.weight"].clone(),
        m + f"{_ATTN}.linear_qkv.weight": qkv_w[sl].reshape(-1, dims.hidden_size).clone(),
        m + f"{_ATTN}.linear_qkv.bias": qkv_b[sl].reshape(-1).clone(),
        m + f"{_ATTN}.linear_proj.weight": _tp_chunk(hf[h + "self_attn.o_proj.weight"], tp, tp_rank, 1),
        m + "pre_mlp_layernorm.weight": hf[h + "post_attention_layernorm.weight"].clone(),
        m + "mlp.linear_fc1.weight": torch.cat([_tp_chunk(gate, tp, tp_rank), _tp_chunk(up, tp, tp_rank)]),
        m + "mlp.linear_fc2.weight": _tp_chunk(hf[h + "mlp.down_proj.weight"], tp, tp_rank, 1),
    }


def stage_layers(dims: ModelDims, pp: int, pp_rank: int) -> range:
    """Global layer indices held by pipeline stage `pp_rank` (megatron's even split)."""
    per = dims.num_layers // pp
    return range(pp_rank * per, (pp_rank + 1) * per)


def hf_to_megatron(hf: Mapping[str, torch.Tensor], dims: ModelDims, layout: Layout, tp_rank: int,
                   pp_rank: int) -> dict[str, torch.Tensor]:
    """The megatron state-dict entries of rank (tp_rank, pp_rank) from full HF tensors."""
    tp, pp = layout.tp, layout.pp
    out: dict[str, torch.Tensor] = {}
    embed = _pad_vocab(hf["model.embed_tokens.weight"], dims, tp)
    if pp_rank == 0:
        out["embedding.word_embeddings.weight"] = _tp_chunk(embed, tp, tp_rank)
    for local, layer in enumerate(stage_layers(dims, pp, pp_rank)):
        out.update(hf_layer_to_megatron(hf, layer, local, dims, tp, tp_rank))
    if pp_rank == pp - 1:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"].clone()
        if not dims.tie_word_embeddings:
            out["output_layer.weight"] = _tp_chunk(_pad_vocab(hf["lm_head.weight"], dims, tp), tp, tp_rank)
        elif pp > 1:
            out["output_layer.weight"] = _tp_chunk(embed, tp, tp_rank)
    return out


def load_hf_into_model(model: torch.nn.Module, hf: Mapping[str, torch.Tensor], dims: ModelDims,
                       layout: Layout) -> None:
    """Copy full HF tensors into this rank's shard; every parameter must be covered."""
    from megatron.core import parallel_state as ps

    local = hf_to_megatron(hf, dims, layout, ps.get_tensor_model_parallel_rank(),
                           ps.get_pipeline_model_parallel_rank())
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


def _tp_gather(t: torch.Tensor) -> list[torch.Tensor]:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size()
    if tp == 1:
        return [t]
    parts = [torch.empty_like(t) for _ in range(tp)]
    dist.all_gather(parts, t.contiguous(), group=ps.get_tensor_model_parallel_group())
    return parts


def megatron_stage_to_hf(model: torch.nn.Module, dims: ModelDims) -> dict[str, torch.Tensor]:
    """Full HF tensors of this pipeline stage (TP all-gather; every TP rank of the stage gets them)."""
    from megatron.core import parallel_state as ps

    pp, pp_rank = ps.get_pipeline_model_parallel_world_size(), ps.get_pipeline_model_parallel_rank()
    sd = {k: v.detach() for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    out: dict[str, torch.Tensor] = {}
    V = dims.vocab_size
    if pp_rank == 0:
        out["model.embed_tokens.weight"] = torch.cat(_tp_gather(sd["embedding.word_embeddings.weight"]))[:V]
    for local, layer in enumerate(stage_layers(dims, pp, pp_rank)):
        m, h = f"decoder.layers.{local}.", f"model.layers.{layer}."
        qkv_w = torch.cat(_tp_gather(sd[m + f"{_ATTN}.linear_qkv.weight"]))
        qkv_b = torch.cat(_tp_gather(sd[m + f"{_ATTN}.linear_qkv.bias"]))
        for (q, k, v), kind in ((_qkv_split(qkv_w, dims), "weight"), (_qkv_split(qkv_b, dims), "bias")):
            out[h + f"self_attn.q_proj.{kind}"] = q
            out[h + f"self_attn.k_proj.{kind}"] = k
            out[h + f"self_attn.v_proj.{kind}"] = v
        out[h + "self_attn.o_proj.weight"] = torch.cat(_tp_gather(sd[m + f"{_ATTN}.linear_proj.weight"]), 1)
        fc1 = _tp_gather(sd[m + "mlp.linear_fc1.weight"])
        out[h + "mlp.gate_proj.weight"] = torch.cat([p.chunk(2)[0] for p in fc1])
        out[h + "mlp.up_proj.weight"] = torch.cat([p.chunk(2)[1] for p in fc1])
        out[h + "mlp.down_proj.weight"] = torch.cat(_tp_gather(sd[m + "mlp.linear_fc2.weight"]), dim=1)
        out[h + "input_layernorm.weight"] = sd[m + "input_layernorm.weight"].clone()
        out[h + "post_attention_layernorm.weight"] = sd[m + "pre_mlp_layernorm.weight"].clone()
    if pp_rank == pp - 1:
        out["model.norm.weight"] = sd["decoder.final_layernorm.weight"].clone()
        if not dims.tie_word_embeddings:
            out["lm_head.weight"] = torch.cat(_tp_gather(sd["output_layer.weight"]))[:V]
    return out


def to_numpy(tensors: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """float32 numpy copies (numpy pickles fast through Ray; torch tensors do not)."""
    return {k: v.detach().to(torch.float32).cpu().numpy() for k, v in tensors.items()}


def save_hf_folder(weights: HFWeights, src_dir: str | Path, out_dir: str | Path,
                   dtype: str = "float32") -> Path:
    """Write an HF folder (config + tokenizer copied from `src_dir`, new weights) that vLLM can load."""
    import shutil

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for f in Path(src_dir).iterdir():
        if f.is_file() and not f.name.startswith(("model.safetensors", "pytorch_model")):
            shutil.copy2(f, tmp / f.name)
    (tmp / "model.safetensors").write_bytes(weights.to_safetensors_bytes(dtype))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def load_safetensors_bytes(blob: bytes) -> dict[str, Any]:
    """Inverse of HFWeights.to_safetensors_bytes (tests, receivers without vLLM)."""
    from safetensors.torch import load

    return dict(load(blob))
