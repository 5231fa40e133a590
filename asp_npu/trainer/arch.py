"""Which HF model families the trainer builds, and why the others are refused (pure; no torch).

One name per family, used by `asp-npu init-model --arch`, `model.architecture` and the HF folder's
`config.json` (`model_type`). The differences that matter to megatron-core and the converter:
- qwen2: q/k/v biases; qwen3: no biases, RMSNorm on each query/key head (megatron `qk_layernorm`);
- qwen3-moe: qwen3 attention, every MLP a top-k routed mixture of experts (no shared expert);
- llama: no biases, no q/k norm (Llama 3 / 3.1 RoPE scaling maps to megatron's `rope_scaling`).
"""

from __future__ import annotations

from typing import Any

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
