"""Which HF model families the trainer builds, and why the others are refused (pure; no torch).

One name per family, used by `asp-npu init-model --arch`, `model.architecture` and the HF folder's
`config.json` (`model_type`). The differences that matter to megatron-core and the converter:
- qwen2: q/k/v biases; qwen3: no biases, RMSNorm on each query/key head (megatron `qk_layernorm`);
- qwen3-moe: qwen3 attention, every MLP a top-k routed mixture of experts (no shared expert);
- llama: no biases, no q/k norm (Llama 3 / 3.1 RoPE scaling maps to megatron's `rope_scaling`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asp_npu.errors import ConfigError

ARCHS: dict[str, str] = {  # our name -> HF config.json model_type
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3-moe": "qwen3_moe",
    "llama": "llama",
}
MODEL_TYPES = {v: k for k, v in ARCHS.items()}

MLA_MISSING = (
    "DeepSeek-V3 (multi-latent attention + MoE) is not supported: megatron-core 0.16.1 builds MLA only "
    "with Transformer Engine's attention (the local layer spec's DotProductAttention has no "
    "k_channels/v_channels: TypeError when instantiating MLASelfAttention), so it cannot run without "
    "TE on CPU, and asp-npu has no MLA HF<->Megatron converter"
)
UNSUPPORTED: dict[str, str] = {"deepseek_v3": MLA_MISSING, "deepseek_v2": MLA_MISSING}


def arch_of_model_type(model_type: str, where: str) -> str:
    """Our family name for an HF `model_type`; ValueError (one line) when we cannot build it."""
    if model_type in UNSUPPORTED:
        raise ValueError(f"{where}: {UNSUPPORTED[model_type]}")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{where}: model_type '{model_type}' is not a supported architecture "
                         f"(supported: {', '.join(ARCHS)})")
    return MODEL_TYPES[model_type]


def hf_arch_problems(hf: dict[str, Any], where: str) -> list[str]:
    """Reasons the trainer cannot build this HF config (empty = it can)."""
    try:
        arch = arch_of_model_type(str(hf.get("model_type", "qwen2")), where)
    except ValueError as exc:
        return [str(exc)]
    problems = []
    if arch == "qwen3-moe":
        if int(hf.get("decoder_sparse_step", 1)) != 1 or hf.get("mlp_only_layers"):
            problems.append(f"{where}: Qwen3-MoE with dense layers (decoder_sparse_step/mlp_only_layers) "
                            "is not supported: every layer must be a MoE layer")
    if arch == "llama":
        if hf.get("attention_bias") or hf.get("mlp_bias"):
            problems.append(f"{where}: Llama with attention_bias/mlp_bias is not supported")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        if kind not in ("default", "llama3"):
            problems.append(f"{where}: RoPE type '{kind}' is not supported (default | llama3)")
        elif kind == "llama3" and (float(rope.get("low_freq_factor", 1.0)) != 1.0
                                   or float(rope.get("high_freq_factor", 4.0)) != 4.0
                                   or int(rope.get("original_max_position_embeddings", 8192)) != 8192):
            problems.append(f"{where}: llama3 RoPE scaling other than low_freq_factor=1, high_freq_factor=4, "
                            "original_max_position_embeddings=8192 is not supported (fixed in megatron-core)")
    return problems


@dataclass(frozen=True)
class ModelDims:
    """The HF config numbers that parallelism and conversion depend on (families: ARCHS above)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    arch: str = "qwen2"  # qwen2 | qwen3 | qwen3-moe | llama
    num_experts: int = 0  # routed experts per MoE layer (0 = dense MLP)
    moe_topk: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalise the top-k routing weights (megatron: softmax after top-k)
    rope_scaling_factor: float = 0.0  # llama3 RoPE scaling factor (0 = none)

    @property
    def qkv_bias(self) -> bool:
        return self.arch == "qwen2"

    @property
    def qk_norm(self) -> bool:
        return self.arch in ("qwen3", "qwen3-moe")

    @property
    def matmul_params(self) -> int:
        """Weights one token multiplies through (MFU's N): attention and MLP projections of every layer
        (MoE: the router and the `moe_topk` active experts) and the output layer; the embedding lookup
        and the norms are not matmuls."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h
        mlp = (self.moe_topk * 3 * h * self.moe_intermediate_size + h * self.num_experts if self.num_experts
               else 3 * h * self.intermediate_size)
        return self.num_layers * (attn + mlp) + h * self.vocab_size

    def train_flops(self, seq_lens: Iterable[int]) -> float:
        """Model FLOPs of one training pass (forward + backward) over sequences of `seq_lens` tokens:
        `6 N` per token plus causal attention, `12 x layers x heads x head_dim` per (query, key) pair a
        query attends to (QK^T and AV, 2 FLOPs each per multiply-add, x3 for the backward): a sequence of
        `s` tokens holds s (s + 1) / 2 such pairs. The usual MFU numerator (PaLM appendix B, causal)."""
        lens = [int(n) for n in seq_lens]
        pairs = sum(n * (n + 1) / 2 for n in lens)
        attention = 12.0 * self.num_layers * self.num_heads * self.head_dim * pairs
        return 6.0 * self.matmul_params * sum(lens) + attention

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> ModelDims:
        heads = int(cfg["num_attention_heads"])
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0)) if isinstance(rope, dict) else 10000.0
        scaled = isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) == "llama3"
        problems = hf_arch_problems(cfg, "model.path config.json")
        if problems:
            raise ConfigError("; ".join(problems))
        arch = arch_of_model_type(str(cfg.get("model_type", "qwen2")), "model.path config.json")
        moe = arch == "qwen3-moe"
        return cls(
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            vocab_size=int(cfg["vocab_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta if theta is not None else 10000.0),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            arch=arch,
            num_experts=int(cfg.get("num_experts") or cfg["num_local_experts"]) if moe else 0,
            moe_topk=int(cfg["num_experts_per_tok"]) if moe else 0,
            moe_intermediate_size=int(cfg["moe_intermediate_size"]) if moe else 0,
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)) if moe else True,
            rope_scaling_factor=float(rope.get("factor", 8.0)) if scaled else 0.0,
        )

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> ModelDims:
        """Read `config.json` of an HF folder (no transformers import: this runs on the driver)."""
        p = Path(path) / "config.json"
        if not p.is_file():
            raise ConfigError(f"model.path: '{path}' has no config.json")
        try:
            return cls.from_hf_dict(json.loads(p.read_text()))
        except ConfigError:
            raise
        except (KeyError, ValueError, TypeError) as exc:
            raise ConfigError(f"{p}: not a supported HF config ({exc})") from None
