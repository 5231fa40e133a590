"""Model families on megatron-core (CPU/gloo): HF logits parity per family at TP=1 and TP=2, and EP=1
vs EP=2 parity of the Qwen3-MoE model after 3 GRPO optimizer steps (fp32, DP=2).

Usage: .venv/bin/python benchmarks/model_families.py [--json OUT]

Models are the trainer tests' tiny random HF models (tests/trainer/helpers.make_hf_model: hidden 64,
4 heads / 2 kv heads, 2 layers, vocabulary 203 so TP=2 pads it, norms/biases/routers perturbed).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asp_npu.io import atomic_write_json  # noqa: E402
from tests.trainer import family_jobs  # noqa: E402
from tests.trainer.helpers import make_hf_model, run_ranks  # noqa: E402

ARCHS = ["qwen2", "qwen3", "qwen3-moe", "llama"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="families-"))
    dirs = {a: str(make_hf_model(root / a, tied=a in ("qwen2", "qwen3"), arch=a, seed=i))
            for i, a in enumerate(ARCHS)}
    order = [dirs[a] for a in ARCHS]
    tp1 = run_ranks(1, family_jobs.parity, order, 1)[0]
    tp2 = run_ranks(2, family_jobs.parity, order, 2)[0]
    result: dict = {"parity": {}, "ep": {}}
    print("| family | max abs logit error TP=1 | TP=2 | HF round trip exact (TP=1, TP=2) |")
    print("|---|---|---|---|")
    for a in ARCHS:
        r1, r2 = tp1[dirs[a]], tp2[dirs[a]]
        result["parity"][a] = {"tp1": r1, "tp2": r2}
        print(f"| {a} | {r1['logit_err']:.2e} | {r2['logit_err']:.2e} | "
              f"{r1['roundtrip_exact']}, {r2['roundtrip_exact']} |")
    ep1 = run_ranks(2, family_jobs.ep_run, dirs["qwen3-moe"], 1)[0]
    ep2 = run_ranks(2, family_jobs.ep_run, dirs["qwen3-moe"], 2)[0]
    grad = max(float(np.abs(ep1["grads"][k] - ep2["grads"][k]).max()) for k in ep1["grads"])
    weight = max(float(np.abs(ep1["weights"][k] - ep2["weights"][k]).max()) for k in ep1["weights"])
    loss = max(abs(x - y) for x, y in zip(ep1["losses"], ep2["losses"], strict=True))
    norm = max(abs(x - y) for x, y in zip(ep1["grad_norms"], ep2["grad_norms"], strict=True))
    result["ep"] = {"losses_ep1": ep1["losses"], "losses_ep2": ep2["losses"], "max_loss_diff": loss,
                    "max_grad_norm_diff": norm, "max_grad_diff": grad, "max_weight_diff": weight,
                    "aux_ep1": ep1["aux"], "aux_ep2": ep2["aux"]}
    print("\nQwen3-MoE, DP=2, 3 GRPO steps, fp32: EP=1 vs EP=2")
    print(f"losses EP=1 {[round(x, 7) for x in ep1['losses']]}  EP=2 {[round(x, 7) for x in ep2['losses']]}")
    print(f"max |loss diff| {loss:.2e}; max |grad-norm diff| {norm:.2e}; max |grad diff| (all HF tensors, "
          f"step 3) {grad:.2e}; max |weight diff| after step 3 {weight:.2e}")
    if args.json:
        atomic_write_json(args.json, result, indent=2)


if __name__ == "__main__":
    main()
