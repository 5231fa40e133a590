"""A megatron-core GPTModel shaped like an HF Qwen2/Qwen2.5 model (local layer spec).

Qwen2 = RMSNorm, SwiGLU MLP, grouped-query attention with bias on q/k/v only, RoPE (rotate-half,
not interleaved), optionally tied embeddings. The local spec (no Transformer Engine, no apex) runs
on CPU/gloo and, with MindSpeed's adaptor imported first, on Ascend.
"""

from __future__ import annotations

from typing import Any

import torch

from asp_npu.trainer.parallel import Layout, ModelDims

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """Megatron splits the vocabulary evenly over TP ranks; pad it up (padded logits are masked)."""
    return -(-vocab_size // tp) * tp


def transformer_config(dims: ModelDims, layout: Layout, dtype: str = "float32",
                       overrides: dict[str, Any] | None = None) -> Any:
    """The megatron TransformerConfig equivalent to the HF config (dropout off: RL wants exact logprobs)."""
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch_dtype = DTYPES[dtype]
    return TransformerConfig(
        num_layers=dims.num_layers,
        hidden_size=dims.hidden_size,
        ffn_hidden_size=dims.intermediate_size,
        num_attention_heads=dims.num_heads,
        num_query_groups=dims.num_kv_heads,
        kv_channels=dims.head_dim,
        layernorm_epsilon=dims.rms_norm_eps,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
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
        variable_seq_lengths=True,
        moe_token_dispatcher_type="alltoall",  # dense; megatron rejects "allgather" with variable lengths
        **(overrides or {}),
    )


def build_model(dims: ModelDims, layout: Layout, dtype: str = "float32",
                overrides: dict[str, Any] | None = None) -> Any:
    """This rank's pipeline stage of the GPTModel (parallel state must be initialised)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from asp_npu.trainer.features import block_spec  # sequence parallelism: TP-summed norm gradients

    config = transformer_config(dims, layout, dtype, overrides)
    return GPTModel(
        config=config,
        transformer_layer_spec=block_spec(get_gpt_layer_local_spec(normalization="RMSNorm"), config),
        vocab_size=padded_vocab_size(dims.vocab_size, layout.tp),
        max_sequence_length=dims.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True,
        share_embeddings_and_output_weights=dims.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=int(dims.rope_theta),
    )
