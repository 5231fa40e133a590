"""A megatron-core GPTModel shaped like an HF Qwen2/Qwen2.5, Qwen3, Qwen3-MoE or Llama 3 model.

All four share RMSNorm, SwiGLU MLPs, grouped-query attention and RoPE (rotate-half, not
interleaved), optionally tied embeddings. They differ in q/k/v biases (Qwen2 only), RMSNorm on each
query/key head (Qwen3: megatron `qk_layernorm`), the MLP (Qwen3-MoE: megatron's MoE layer, a top-k
softmax router with a load-balancing aux loss over SequentialMLP experts, tokens exchanged by the
allgather dispatcher, experts split over `expert_model_parallel_size` ranks and each over the expert
tensor-parallel size) and RoPE scaling
(Llama 3.1). The local spec (no Transformer Engine, no apex) runs on CPU/gloo and, with MindSpeed's
adaptor imported first, on Ascend.
"""

from __future__ import annotations

from typing import Any

import torch

from asp_npu.arch import ModelDims
from asp_npu.core.layout import ParallelLayout

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """Megatron splits the vocabulary evenly over TP ranks; pad it up (padded logits are masked)."""
    return -(-vocab_size // tp) * tp


def moe_fields(dims: ModelDims, layout: ParallelLayout) -> dict[str, Any]:
    """TransformerConfig fields of the MoE layers (empty for dense models).

    Routing matches HF Qwen3-MoE: softmax over the top-k logits equals softmax-then-top-k-then-
    renormalise (`norm_topk_prob`); without renormalisation megatron takes the softmax first
    (`moe_router_pre_softmax`). Experts are a SequentialMLP (no grouped GEMM: it needs Transformer
    Engine or the grouped_gemm package); tokens move with the allgather dispatcher, which gloo runs.
    """
    if not dims.num_experts:
        return {}
    return dict(
        num_moe_experts=dims.num_experts,
        moe_router_topk=dims.moe_router_topk,
        moe_ffn_hidden_size=dims.moe_ffn_hidden_size,
        moe_router_pre_softmax=not dims.norm_topk_prob,
        moe_router_score_function="softmax",
        moe_grouped_gemm=False,
        moe_token_dispatcher_type="allgather",
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=1e-3,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.expert_tp,
    )


def transformer_config(dims: ModelDims, layout: ParallelLayout, dtype: str = "float32",
                       overrides: dict[str, Any] | None = None) -> Any:
    """The megatron TransformerConfig equivalent to the HF config (dropout off: RL wants exact logprobs).

    `overrides` (device fields, MoE training settings such as `moe_aux_loss_coeff`) win."""
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch_dtype = DTYPES[dtype]
    fields: dict[str, Any] = {**moe_fields(dims, layout), **(overrides or {})}
    return TransformerConfig(
        num_layers=dims.num_layers,
        hidden_size=dims.hidden_size,
        ffn_hidden_size=dims.intermediate_size,
        num_attention_heads=dims.num_attention_heads,
        num_query_groups=dims.num_key_value_heads,
        kv_channels=dims.head_dim,
        layernorm_epsilon=dims.rms_norm_eps,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=dims.qkv_bias,
        qk_layernorm=dims.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        context_parallel_size=layout.cp,
        pipeline_model_parallel_layout=layout.pipeline_layout(),  # uneven stages (None: even split)
        params_dtype=torch_dtype,
        pipeline_dtype=torch_dtype,
        bf16=torch_dtype == torch.bfloat16,
        fp16=torch_dtype == torch.float16,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        attention_softmax_in_fp32=True,
        calculate_per_token_loss=True,
        # micro-batches differ in length; MoE models run PP=1 (allgather rejects variable lengths)
        variable_seq_lengths=not dims.num_experts,
        **{"moe_token_dispatcher_type": "alltoall", **fields},
    )


def build_model(dims: ModelDims, layout: ParallelLayout, dtype: str = "float32",
                overrides: dict[str, Any] | None = None, cp_gather_attention: bool = True,
                packed_split_attention: bool = False) -> Any:
    """This rank's pipeline stage of the GPTModel (parallel state must be initialised).

    `cp_gather_attention` / `packed_split_attention`: context parallelism / packed micro-batches through
    asp-npu's core attention (`features.block_spec`)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from asp_npu.trainer.features import block_spec  # sequence / context parallel modules

    config = transformer_config(dims, layout, dtype, overrides)
    spec = get_gpt_layer_local_spec(num_experts=dims.num_experts or None, moe_grouped_gemm=False,
                                    qk_layernorm=dims.qk_norm, normalization="RMSNorm")
    return GPTModel(
        config=config,
        transformer_layer_spec=block_spec(spec, config, cp_gather_attention, packed_split_attention),
        vocab_size=padded_vocab_size(dims.vocab_size, layout.tp),
        max_sequence_length=dims.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True,
        share_embeddings_and_output_weights=dims.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=int(dims.rope_theta),
        rope_scaling=dims.rope_scaling_factor > 0,
        rope_scaling_factor=dims.rope_scaling_factor or 8.0,
    )
