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
    """A model's dimensions, the one type for them: what the trainer builds and converts (families:
    ARCHS above) and what `check` sizes (also DeepSeek-V3's MLA and shared experts, which only `check`
    reads). Field names are megatron's / the `model.arch` config section's; `model_type` is HF's."""

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    model_type: str = "qwen2"  # HF config.json model_type: qwen2 | qwen3 | qwen3_moe | llama | deepseek_v3
    head_dim: int = 0  # per-head channels (megatron kv_channels); 0 = hidden_size / num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling_factor: float = 0.0  # llama3 RoPE scaling factor (0 = none)
    num_experts: int = 0  # routed experts per MoE layer (0 = dense MLP)
    moe_router_topk: int = 0
    moe_ffn_hidden_size: int = 0  # one routed expert's FFN width
    norm_topk_prob: bool = True  # renormalise the top-k routing weights (megatron: softmax after top-k)
    moe_shared_expert_intermediate_size: int = 0  # shared experts' FFN width (DeepSeek)
    first_k_dense_replace: int = 0  # leading dense layers (DeepSeek)
    q_lora_rank: int = 0  # MLA: query low-rank dim (0 = full-rank query)
    kv_lora_rank: int = 0  # MLA: compressed KV dim (> 0 = multi-latent attention)
    qk_head_dim: int = 0  # MLA: per-head q/k dim without RoPE (qk_nope_head_dim)
    qk_pos_emb_head_dim: int = 0  # MLA: per-head RoPE dim (qk_rope_head_dim)
    v_head_dim: int = 0  # MLA: per-head value dim

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // max(1, self.num_attention_heads))

    @property
    def family(self) -> str:
        """Our family name (ARCHS): qwen2 | qwen3 | qwen3-moe | llama; HF's model_type otherwise."""
        return MODEL_TYPES.get(self.model_type, self.model_type)

    @property
    def qkv_bias(self) -> bool:
        return self.model_type == "qwen2"

    @property
    def qk_norm(self) -> bool:
        return self.model_type in ("qwen3", "qwen3_moe")

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    @property
    def moe_layers(self) -> int:
        return max(0, self.num_layers - self.first_k_dense_replace) if self.moe else 0

    @property
    def attention_params(self) -> int:
        """One layer's attention: GQA q/k/v/o (+ qkv biases for qwen2, + q/k norms for qwen3), or MLA."""
        h, a, hd = self.hidden_size, self.num_attention_heads, self.head_dim
        if self.mla:
            qk = self.qk_head_dim + self.qk_pos_emb_head_dim
            q = (
                (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * a * qk)
                if self.q_lora_rank
                else h * a * qk
            )
            kv = h * (self.kv_lora_rank + self.qk_pos_emb_head_dim) + self.kv_lora_rank
            kv += self.kv_lora_rank * a * (self.qk_head_dim + self.v_head_dim)
            return q + kv + a * self.v_head_dim * h
        kv = self.num_key_value_heads * hd
        params = 2 * h * a * hd + 2 * h * kv
        if self.model_type == "qwen2":
            params += a * hd + 2 * kv
        if self.model_type in ("qwen3", "qwen3_moe"):
            params += 2 * hd
        return params

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size  # SwiGLU: gate, up, down

    @property
    def expert_params(self) -> int:
        """All routed experts of the model (what expert parallelism shards)."""
        return self.moe_layers * self.num_experts * 3 * self.hidden_size * self.moe_ffn_hidden_size

    @property
    def moe_layer_dense_params(self) -> int:
        """A MoE layer's non-expert MLP part: router and shared experts."""
        return (
            self.hidden_size * self.num_experts
            + 3 * self.hidden_size * self.moe_shared_expert_intermediate_size
        )

    @property
    def layer_params(self) -> int:
        """Average per-layer weights that TP shards (all but routed experts): attention, MLP, 2 norms."""
        dense_layers = self.num_layers - self.moe_layers
        mlp = dense_layers * self.dense_mlp_params + self.moe_layers * self.moe_layer_dense_params
        return self.attention_params + 2 * self.hidden_size + mlp // max(1, self.num_layers)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def dense_params(self) -> int:
        """Everything but the routed experts."""
        emb = self.embedding_params * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * self.layer_params + emb + self.hidden_size

    @property
    def params(self) -> int:
        return self.dense_params + self.expert_params

    @property
    def active_params(self) -> int:
        """Weights one token passes through (MoE: top-k experts of each MoE layer)."""
        per_expert = 3 * self.hidden_size * self.moe_ffn_hidden_size
        return self.dense_params + self.moe_layers * self.moe_router_topk * per_expert

    @property
    def active_ffn(self) -> int:
        """FFN width a token passes through in an average layer (activation and workspace sizing)."""
        if not self.moe:
            return self.intermediate_size
        moe_ffn = self.moe_router_topk * self.moe_ffn_hidden_size + self.moe_shared_expert_intermediate_size
        dense = self.num_layers - self.moe_layers
        return (dense * self.intermediate_size + self.moe_layers * moe_ffn) // self.num_layers

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int) -> float:
        """vLLM KV cache per token on one NPU: GQA K and V per kv head (heads replicated when TP exceeds
        them); MLA caches the compressed latent plus the RoPE key, replicated on every TP rank."""
        if self.mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_pos_emb_head_dim) * dtype_bytes
        kv_heads = max(1, self.num_key_value_heads // tp)
        return 2 * self.num_layers * kv_heads * self.head_dim * dtype_bytes

    def describe(self) -> str:
        s = (
            f"{self.params / 1e9:.2f}B params ({self.model_type}, hidden {self.hidden_size}, "
            f"{self.num_layers} layers, {self.num_attention_heads} heads / {self.num_key_value_heads} kv, "
            f"head_dim {self.head_dim}, vocab {self.vocab_size}, ffn {self.intermediate_size}"
        )
        if self.moe:
            s += (
                f"; MoE {self.num_experts} experts top-{self.moe_router_topk} x ffn "
                f"{self.moe_ffn_hidden_size} in {self.moe_layers} layers, "
                f"{self.active_params / 1e9:.1f}B active"
            )
        if self.mla:
            s += f"; MLA kv_lora_rank {self.kv_lora_rank}, q_lora_rank {self.q_lora_rank}"
        return s + ")"

    @property
    def matmul_params(self) -> int:
        """Weights one token multiplies through (MFU's N): attention and MLP projections of every layer
        (MoE: the router and the `moe_router_topk` active experts) and the output layer; the embedding lookup
        and the norms are not matmuls."""
        h = self.hidden_size
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h
        moe = self.moe_router_topk * 3 * h * self.moe_ffn_hidden_size + h * self.num_experts
        mlp = moe if self.num_experts else 3 * h * self.intermediate_size
        return self.num_layers * (attn + mlp) + h * self.vocab_size

    def train_flops(self, seq_lens: Iterable[int]) -> float:
        """Model FLOPs of one training pass (forward + backward) over sequences of `seq_lens` tokens:
        `6 N` per token plus causal attention, `12 x layers x heads x head_dim` per (query, key) pair a
        query attends to (QK^T and AV, 2 FLOPs each per multiply-add, x3 for the backward): a sequence of
        `s` tokens holds s (s + 1) / 2 such pairs. The usual MFU numerator (PaLM appendix B, causal)."""
        lens = [int(n) for n in seq_lens]
        pairs = sum(n * (n + 1) / 2 for n in lens)
        attention = 12.0 * self.num_layers * self.num_attention_heads * self.head_dim * pairs
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
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            vocab_size=int(cfg["vocab_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta if theta is not None else 10000.0),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            model_type=ARCHS[arch],
            num_experts=int(cfg.get("num_experts") or cfg["num_local_experts"]) if moe else 0,
            moe_router_topk=int(cfg["num_experts_per_tok"]) if moe else 0,
            moe_ffn_hidden_size=int(cfg["moe_intermediate_size"]) if moe else 0,
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
