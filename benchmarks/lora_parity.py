"""LoRA on megatron-core's TP layers: base bytes before/after 3 GRPO steps, adapter gradients and merged
weights TP=2 (with and without sequence parallelism) vs TP=1, on the trainer tests' tiny random model.

    python benchmarks/lora_parity.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.trainer import lora_jobs  # noqa: E402
from tests.trainer.helpers import make_hf_model, run_ranks  # noqa: E402

TWO = {"tp2": {"tensor_model_parallel_size": 2},
       "tp2_sp": {"tensor_model_parallel_size": 2, "sequence_parallel": True}}


def main() -> None:
    import numpy as np

    with tempfile.TemporaryDirectory() as d:
        model = str(make_hf_model(Path(d) / "hf", tied=True))
        one = run_ranks(1, lora_jobs.lora_training, model, {"base": {}})[0]["base"]
        two = run_ranks(2, lora_jobs.lora_training, model, TWO, timeout=480.0)
    out = {"tp1": {"base_bytes_unchanged": one["base_before"] == one["base_after"],
                   "trainable": len(one["trainable"]), "optimizer_params": one["optimizer_params"],
                   "min_adapter_move": min(one["adapter_moved"].values()), "losses": one["losses"]}}
    for name in TWO:
        got = two[0][name]
        out[name] = {
            "base_bytes_unchanged": all(r[name]["base_before"] == r[name]["base_after"] for r in two),
            "max_adapter_grad_diff_per_step": [max(float(np.abs(a[k] - b[k]).max()) for k in a)
                                               for a, b in zip(one["grads"], got["grads"], strict=True)],
            "max_adapter_grad_per_step": [max(float(np.abs(a[k]).max()) for k in a) for a in one["grads"]],
            "max_merged_weight_diff": max(float(np.abs(one["merged"][k] - got["merged"][k]).max())
                                          for k in one["merged"]),
            "max_loss_diff": max(abs(a - b) for a, b in zip(one["losses"], got["losses"], strict=True))}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
