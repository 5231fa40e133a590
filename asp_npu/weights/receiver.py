"""vLLM worker extension: the object-store weight_refresh (the fallback that needs no process group)
and small probes of the weight-transfer engine (`asp_npu.weights.gloo_engine`).

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
from asp_npu.weights import gloo_engine  # noqa: F401
from asp_npu.weights.vllm_fixes import repack_cpu_moe_experts, with_tied_head

EXTENSION_CLS = "asp_npu.weights.receiver.WeightReceiver"


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

    def load_safetensors_bytes_counted(self, blob: bytes) -> tuple[float, dict]:
        """`load_safetensors_bytes`, also returning `token_counts` as of the load: both run between the
        same two engine steps, so the counts split every request's tokens exactly into old and new."""
        counts = self.token_counts()
        return self.load_safetensors_bytes(blob), counts

    def token_counts(self) -> dict[str, tuple[int, bool]]:
        """Per request this worker holds: (tokens generated so far, whether its last token ended it).

        A request's next token comes from whatever weights are live at the next engine step, so these
        counts are the version change points of per-token behaviour versions (`vllm_engine`). `ended`
        marks a request that finished in the last step (the scheduler has not dropped it yet): it will
        generate nothing more. Requests not scheduled yet (or preempted) are absent."""
        out: dict[str, tuple[int, bool]] = {}
        for rid, st in getattr(getattr(self, "model_runner", None), "requests", {}).items():
            toks = st.output_token_ids
            out[rid] = (len(toks), _ended(toks, st.sampling_params))
        return out

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


def _ended(tokens: list[int], params: object) -> bool:
    """vLLM's stop check (`v1/core/sched/utils.check_stop`, same order): EOS, stop token ids, length."""
    if not tokens or params is None:
        return False
    last = tokens[-1]
    eos = getattr(params, "eos_token_id", None)
    if (eos is not None and last == eos) or last in (getattr(params, "stop_token_ids", None) or ()):
        return True
    return len(tokens) >= (getattr(params, "max_tokens", None) or 1 << 62)
