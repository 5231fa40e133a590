"""Loss figures (deterministic): the issue's extreme cases, and the loss on megatron-core over gloo.

Usage: .venv/bin/python benchmarks/loss_parity.py [--json]

- the extreme cases of issue 31 through `policy_loss` (value and gradient);
- on the tests' tiny random Qwen2 model (vocabulary 203, so TP=2 pads it), three GRPO steps with an
  entropy bonus, adaptive KL in the loss and seq-mean-token-mean aggregation (`tests/trainer/loss_jobs.py`):
  per-token entropy and step metrics of TP=2, DP=2 and micro-batch 1 against TP=1, the same with the
  KL in the reward, the adaptive controller's coefficients against its formula, and the weights after
  a step on a batch with junk (-inf / NaN / 1e30) at its padded positions against the clean batch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asp_npu.device import loopback_env  # noqa: E402
from tests.trainer import loss_jobs  # noqa: E402
from tests.trainer.helpers import make_hf_model, run_ranks  # noqa: E402

ONE = {"TP1": {}, "TP1 mbs1": {"micro_batch_size": 1}, "TP1 reward": {"use_kl_in_reward": True}}
TWO = {"TP2": {"tensor_model_parallel_size": 2}, "DP2": {"data_parallel_size": 2},
       "TP2 reward": {"tensor_model_parallel_size": 2, "use_kl_in_reward": True}}
KEYS = ("loss", "entropy", "kl", "kl_coef", "grad_norm", "kl_reward_penalty")


def extreme_cases() -> dict[str, Any]:
    """(loss, gradient) of the cases issue 31 lists, through the current `policy_loss`."""
    import torch

    from asp_npu.trainer.losses import LossConfig, policy_loss

    out: dict[str, Any] = {}
    zero, one = torch.zeros(1, 1), torch.ones(1, 1)
    for name, lr, c in (("log-ratio 30, A=-1, dual clip 3", 30.0, 3.0),
                        ("r=5, A=-1, dual clip 3", math.log(5), 3.0),
                        ("log-ratio 30, A=-1, no dual clip", 30.0, 0.0)):
        logp = torch.tensor([[lr]], requires_grad=True)
        loss, _ = policy_loss(logp, zero, zero, -one, one, LossConfig(clip_ratio_c=c, importance_cap=0.0))
        (g,) = torch.autograd.grad(loss, logp)
        out[name] = (float(loss), float(g))
    logp = torch.tensor([[-1.0, -100.0]], requires_grad=True)  # k3 at d = 95 on a masked position
    loss, _ = policy_loss(logp, logp.detach(), logp.detach(), torch.ones(1, 2), torch.tensor([[1.0, 0.0]]),
                          LossConfig(kl_coef=1.0, importance_cap=0.0), 1.0, torch.tensor([[-1.0, -5.0]]))
    (g,) = torch.autograd.grad(loss, logp)
    out["k3 d=95 masked: gradient"] = g[0].tolist()
    return out


def _diffs(runs: dict[str, Any]) -> dict[str, Any]:
    ref, got = runs["TP1"]["entropy"], runs["TP2"]["entropy"]
    out: dict[str, Any] = {"entropy per token TP2 vs TP1": max(abs(a - b) for i in ref
                                                               for a, b in zip(ref[i], got[i], strict=True))}
    for name in ("TP2", "DP2", "TP1 mbs1", "TP2 reward"):
        base = runs["TP1 reward" if "reward" in name else "TP1"]["metrics"]
        for k in KEYS:
            if k in base[0]:
                out[f"{name} vs {'TP1 reward' if 'reward' in name else 'TP1'}: {k}"] = max(
                    abs(a[k] - b[k]) for a, b in zip(runs[name]["metrics"], base, strict=True))
    rl = loss_jobs.LOSS_RL
    for name in ("TP1", "TP1 reward"):
        m = runs[name]["metrics"]
        worst = 0.0
        for prev, nxt in zip(m, m[1:], strict=False):
            err = float(np.clip(prev["kl_seq_mean"] / rl["kl_target"] - 1, -0.2, 0.2))
            want = prev["kl_coef"] * (1 + err * prev["samples"] / rl["kl_horizon"])
            worst = max(worst, abs(nxt["kl_coef"] - want) / want)
        out[f"{name}: kl_coef per step"] = [x["kl_coef"] for x in m]
        out[f"{name}: kl_seq_mean per step"] = [x["kl_seq_mean"] for x in m]
        out[f"{name}: max rel. deviation from the controller formula"] = worst
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    for k, v in {**loopback_env(), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}.items():
        os.environ.setdefault(k, v)
    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_hf_model(Path(tmp) / "m", tied=False, seed=1))
        one = run_ranks(1, loss_jobs.loss_parity, model, ONE, timeout=900)[0]
        two = run_ranks(2, loss_jobs.loss_parity, model, TWO, timeout=900)[0]
        junk_model = str(make_hf_model(Path(tmp) / "j", tied=True))
        junk = run_ranks(1, loss_jobs.padded_junk, junk_model, timeout=900)[0]
    res: dict[str, Any] = {"extreme cases (loss, gradient)": extreme_cases(), **_diffs({**one, **two})}
    res["padded junk: positions"] = junk["junk"]["junked_positions"]
    res["padded junk: max |weight difference|"] = max(float(np.abs(v - junk["junk"]["weights"][k]).max())
                                                     for k, v in junk["clean"]["weights"].items())
    res["padded junk: loss clean, junk"] = [junk["clean"]["metrics"]["loss"], junk["junk"]["metrics"]["loss"]]
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        for k, v in res.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
