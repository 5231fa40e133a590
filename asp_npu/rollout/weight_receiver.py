"""vLLM worker extension: the object-store weight_refresh (the fallback that needs no process group)
and small probes of the weight-transfer engine (`asp_npu.rollout.weight_transfer`).

Why a worker extension: tensors sent through `collective_rpc` arrive as nested lists, and calling
`model.load_weights` directly breaks on backends that repack linear weights (vLLM CPU does). So
the trainer's state dict (HF parameter names) travels as one safetensors blob and the worker feeds
it to vLLM's own `reload_weights(..., is_checkpoint_format=True)`, which handles name mapping,
q/k/v and gate/up fusion and any repacking. The caller must then reset the prefix cache, or KV
blocks computed with the old weights are reused.

This module is imported inside vLLM's worker process (where vLLM is already loaded).
"""

from __future__ import annotations

import time

# registers the `gloo` weight-transfer engine with vLLM's factory: vLLM imports this module in every
# worker before the worker builds its weight-transfer engine
from asp_npu.rollout import weight_transfer  # noqa: F401
from asp_npu.rollout.moe_repack import repack_cpu_moe_experts

EXTENSION_CLS = "asp_npu.rollout.weight_receiver.WeightReceiver"


class WeightReceiver:
    """Mixed into vLLM's worker class (`worker_extension_cls`); `self` is the worker."""

    def load_safetensors_bytes(self, blob: bytes) -> float:
        """Load HF-named weights from a safetensors blob in place; returns seconds spent."""
        from safetensors.torch import load

        t0 = time.perf_counter()
        weights = list(with_tied_head(self, dict(load(bytes(blob)))).items())
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)  # type: ignore[attr-defined]
        repack_cpu_moe_experts(self)
        return time.perf_counter() - t0

    def weight_transfer_stats(self) -> dict:
        """What the last refresh through the weight-transfer engine cost here (gloo engine; else empty)."""
        return dict(getattr(getattr(self, "weight_transfer_engine", None), "last", None) or {})

    def weight_transfer_received(self) -> bool:
        """Whether a refresh the transfer engine receives in the background has arrived (True if the
        engine receives inside update_weights, as vLLM's nccl engine does)."""
        received = getattr(getattr(self, "weight_transfer_engine", None), "received", None)
        return True if received is None else bool(received())

    def void_weight_update(self) -> bool:
        """End the weight-update session a broken group left open (vLLM's worker refuses a new
        `start_weight_update` while one is active and has no abort); True if one was open."""
        if not getattr(self, "_weight_update_active", False):
            return False
        self._weight_update_active = False
        engine = getattr(self, "weight_transfer_engine", None)
        if engine is not None:
            engine.reset_weight_update_target()
        return True

    def cpu_affinity(self) -> list[int]:
        """Cores this worker's threads may run on (union over threads): checks per-instance pinning."""
        import os

        cores: set[int] = set()
        for tid in os.listdir("/proc/self/task"):
            try:
                cores |= os.sched_getaffinity(int(tid))
            except OSError:
                continue
        return sorted(cores)


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
