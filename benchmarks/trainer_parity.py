"""Parity figures of the megatron-core trainer on CPU (fp32, gloo): what tests/trainer asserts, measured.

Usage: .venv/bin/python benchmarks/trainer_parity.py [--json] [--optimizer | --packing]

`--optimizer` measures only the optimizer figures (docs/bench/optim.md): host-resident optimizer state
(`actor_config.optimizer_cpu_offload`, fraction 1.0 / 0.5 / 0.25, megatron's HybridDeviceOptimizer) vs
the plain distributed optimizer at DP=1 and DP=2 (losses, gradients, device/host optimizer bytes per
rank next to what `check` predicts; bf16 weights at DP=1 for the bytes only),
and the lr schedule (per-step lr vs megatron's OptimizerParamScheduler, resume mid-schedule).

On the tests' tiny random Qwen2 model (2 layers, hidden 64, vocabulary 203), three GRPO steps each:
- max |loss difference|, max |gradient difference| (every HF-named tensor, before each of the 3
  optimizer steps) and max |logprob difference| (whole sequences after the steps) of DP=2 with the
  distributed optimizer vs DP=1, TP=2 with sequence parallelism vs TP=1, context parallelism (CP=2,
  CP=2 with the distributed optimizer, TP=2 + SP x CP=2 on 4 ranks) vs TP=1, and full (uniform /
  block) and selective recomputation vs none;
- per-rank allocated bytes of weights, gradients and optimizer state (`trainer.memory`);
- checkpoints saved at TP=2 x DP=1 resumed at TP=1 x DP=2, and at CP=2 resumed at TP=2: the next two
  losses vs uninterrupted.

`--packing` measures only packed micro-batches (`actor_config.use_remove_padding`) against the
right-padded path: TP=1 (micro_batch_size and a use_dynamic_bsz token budget), TP=1 x DP=2 with the
budget, full recomputation, TP=2 with sequence parallelism and PP=2 (each pipeline stage's
gradients), and shows the one-line refusal of packing with CP=2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asp_npu.device import loopback_env  # noqa: E402
from tests.trainer import jobs  # noqa: E402
from tests.trainer.helpers import (  # noqa: E402
    PACKED_PAIRS,
    PACKED_SETUPS,
    make_hf_model,
    parity_figures,
    run_ranks,
)

ONE_RANK = {
    "TP1 DP1": {},
    "TP1 DP1 distopt": {"use_distributed_optimizer": True},
    "recompute full uniform": {"recompute_granularity": "full", "recompute_method": "uniform",
                               "recompute_num_layers": 1},
    "recompute full block": {"recompute_granularity": "full", "recompute_method": "block",
                             "recompute_num_layers": 2},
    "recompute selective": {"recompute_granularity": "selective"},
}
TWO_RANKS = {
    "TP1 DP2 distopt": {"data_parallel_size": 2, "use_distributed_optimizer": True},
    "TP2 DP1 SP": {"tensor_model_parallel_size": 2, "sequence_parallel": True},
    "CP2": {"context_parallel_size": 2},
    "CP2 distopt": {"context_parallel_size": 2, "use_distributed_optimizer": True},
}
FOUR_RANKS = {"TP2 SP x CP2": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                               "context_parallel_size": 2}}
PAIRS = [("TP1 DP2 distopt", "TP1 DP1 distopt"), ("TP2 DP1 SP", "TP1 DP1"), ("CP2", "TP1 DP1"),
         ("CP2 distopt", "TP1 DP1 distopt"), ("TP2 SP x CP2", "TP1 DP1"),
         ("recompute full uniform", "TP1 DP1"), ("recompute full block", "TP1 DP1"),
         ("recompute selective", "TP1 DP1")]


def _offload(fraction: float, dp: int = 1, dtype: str = "float32") -> dict:
    return {"data_parallel_size": dp, "use_distributed_optimizer": True, "optimizer_cpu_offload": True,
            "optimizer_offload_fraction": fraction, **({"dtype": dtype} if dtype != "float32" else {})}


OFFLOAD_ONE = {"TP1 DP1 distopt": {"use_distributed_optimizer": True},
               "TP1 DP1 offload 1.0": _offload(1.0), "TP1 DP1 offload 0.5": _offload(0.5),
               "TP1 DP1 offload 0.25": _offload(0.25),
               "TP1 DP1 bf16 distopt": {"use_distributed_optimizer": True, "dtype": "bfloat16"},
               "TP1 DP1 bf16 offload 1.0": _offload(1.0, 1, "bfloat16"),
               "TP1 DP1 bf16 offload 0.5": _offload(0.5, 1, "bfloat16")}
OFFLOAD_TWO = {"TP1 DP2 distopt": {"data_parallel_size": 2, "use_distributed_optimizer": True},
               "TP1 DP2 offload 1.0": _offload(1.0, 2), "TP1 DP2 offload 0.5": _offload(0.5, 2),
               "TP1 DP2 offload 0.25": _offload(0.25, 2)}
OFFLOAD_PAIRS = [(f"TP1 DP{d} offload {f}", f"TP1 DP{d} distopt")
                 for d in (1, 2) for f in ("1.0", "0.5", "0.25")]


def predicted_optimizer_bytes(model: str, fields: dict) -> dict[str, list[dict[str, int]]]:
    """What `check` predicts per DP rank for a setup (`asp_npu.deploy.memory.optimizer_splits`: megatron's
    HybridDeviceOptimizer rule on the stage's tensors, step counters included), and the rule it used
    before (a plain (1 - fraction) / fraction share of the rank's shard)."""
    from asp_npu.arch import ModelDims
    from asp_npu.deploy.hybrid import HOST_BYTES, MASTER_BYTES, MOMENT_BYTES
    from asp_npu.deploy.memory import offload_fraction, optimizer_splits
    from tests.trainer.helpers import trainer_config

    cfg = trainer_config(Path(model))
    for k, v in fields.items():
        setattr(cfg.model if k == "dtype" else cfg.actor_config, k, v)
    master = cfg.model.dtype != "float32"
    off = offload_fraction(cfg)
    splits = optimizer_splits(cfg, ModelDims.from_hf_dir(model), 0)[0]
    per = MOMENT_BYTES + (MASTER_BYTES if master else 0)
    earlier = [{"device": round((1 - off) * per * (s.device + s.host)),
                "host": round(off * HOST_BYTES * (s.device + s.host))} for s in splits]
    return {"now": [s.measured_like(master) for s in splits], "earlier": earlier}


def _parity(runs: dict, pairs: list[tuple[str, str]]) -> list[dict]:
    out = []
    for name, ref in pairs:
        a, b = runs[name], runs[ref]
        out.append({
            "setup": name, "reference": ref,
            "max_loss_diff": max(abs(x - y) for x, y in zip(a["losses"], b["losses"], strict=True)),
            "max_grad_diff": max(float(np.abs(ga[k] - gb[k]).max())
                                 for ga, gb in zip(a["grads"], b["grads"], strict=True) for k in ga),
            "max_logprob_diff": max(abs(x - y) for la, lb in zip(a["logprobs"], b["logprobs"], strict=True)
                                    for x, y in zip(la, lb, strict=True)),
            "losses": a["losses"]})
    return out


def optimizer_figures(model: str, tmp: str) -> dict:
    """Host-resident optimizer parity and bytes per rank; the lr schedule and its resume."""
    one = run_ranks(1, jobs.training_parity, model, OFFLOAD_ONE, timeout=900)[0]
    two = run_ranks(2, jobs.training_parity, model, OFFLOAD_TWO, timeout=900)
    sched = run_ranks(1, jobs.schedule_and_resume, model, str(Path(tmp) / "ckpt_sched"), timeout=900)[0]
    memory = {**{k: [one[k]["optimizer_bytes"]] for k in OFFLOAD_ONE},
              **{k: [r[k]["optimizer_bytes"] for r in two] for k in OFFLOAD_TWO}}
    predicted = {k: predicted_optimizer_bytes(model, v) for k, v in {**OFFLOAD_ONE, **OFFLOAD_TWO}.items()}
    return {"parity": _parity({**one, **two[0]}, OFFLOAD_PAIRS), "optimizer_bytes_per_rank": memory,
            "predicted_optimizer_bytes_per_rank": predicted,
            "schedule": {"lr_per_step": sched["lrs"], "megatron_reference": sched["reference"],
                         "exact": sched["lrs"] == sched["reference"],
                         "resumed_lrs": sched["resumed_lrs"], "uninterrupted_lrs": sched["lrs"][4:6],
                         "resumed_losses": sched["resumed_losses"],
                         "uninterrupted_losses": sched["losses"][4:6],
                         "optimizer_steps_after_3_steps_of_2_epochs": sched["epoch_steps"]}}


def _pct(predicted: int, measured: int) -> str:
    return f"{(predicted - measured) / measured:+.1%}" if measured else ("0" if not predicted else "inf")


def _print_optimizer(out: dict) -> None:
    print(f"{'setup':<24} {'vs':<16} {'max |dloss|':>12} {'max |dgrad|':>12} {'max |dlogp|':>12}")
    for p in out["parity"]:
        dl, dg, dp = p["max_loss_diff"], p["max_grad_diff"], p["max_logprob_diff"]
        print(f"{p['setup']:<24} {p['reference']:<16} {dl:>12.2e} {dg:>12.2e} {dp:>12.2e}")
    print("\noptimizer bytes per rank, measured vs `check` (megatron's rule; the earlier fraction rule):")
    print("| setup | rank | device measured | device predicted | diff | host measured | host predicted "
          "| diff | earlier rule device / host |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k, v in out["optimizer_bytes_per_rank"].items():
        pred = out["predicted_optimizer_bytes_per_rank"][k]
        for r, (m, p, e) in enumerate(zip(v, pred["now"], pred["earlier"], strict=True)):
            print(f"| {k} | {r} | {m['device']:,} | {p['device']:,} | {_pct(p['device'], m['device'])} "
                  f"| {m['host']:,} | {p['host']:,} | {_pct(p['host'], m['host'])} "
                  f"| {e['device']:,} / {e['host']:,} |")
    s = out["schedule"]
    print(f"\nlr per step: {s['lr_per_step']}\nmegatron:    {s['megatron_reference']}\nexact: {s['exact']}")
    print(f"resume after step 4: lrs {s['resumed_lrs']} vs {s['uninterrupted_lrs']}, losses "
          f"{s['resumed_losses']} vs {s['uninterrupted_losses']}")


ONE_RANK_PACKED = {
    "TP1 DP1": {}, "TP1 DP1 packed": {"use_remove_padding": True},
    "TP1 DP1 packed dynbsz": {"use_remove_padding": True, "use_dynamic_bsz": True,
                              "ppo_max_token_len_per_gpu": 40},
    "TP1 DP1 packed recompute full": {"use_remove_padding": True, "recompute_granularity": "full",
                                      "recompute_method": "uniform", "recompute_num_layers": 1},
}


def packing_parity(model: str) -> dict:
    """Packed vs right-padded: max |difference| of losses, gradients and log-probs per layout."""
    from asp_npu.config import Config, validate

    one = run_ranks(1, jobs.training_parity, model, ONE_RANK_PACKED, timeout=900)[0]
    two = run_ranks(2, jobs.training_parity, model, PACKED_SETUPS, timeout=900)
    rows = [{"setup": n, "reference": "TP1 DP1", "rank": 0, **parity_figures(one[n], one["TP1 DP1"])}
            for n in ONE_RANK_PACKED if n != "TP1 DP1"]
    rows += [{"setup": n, "reference": ref, "rank": r, **parity_figures(res[n], res[ref])}
             for n, ref in PACKED_PAIRS for r, res in enumerate(two)]
    cfg = Config()
    cfg.model.build_if_missing = True
    cfg.actor_config.use_remove_padding, cfg.actor_config.context_parallel_size = True, 2
    refusal = [p for p in validate(cfg) if "use_remove_padding" in p]
    return {"packing_parity": rows, "cp2_refusal": refusal}


def _print_packing(out: dict) -> None:
    print(f"{'packed setup':<30} {'vs':<12} {'rank':>4} "
          f"{'max |dloss|':>12} {'max |dgrad|':>12} {'max |dlogp|':>12}")
    for p in out["packing_parity"]:
        print(f"{p['setup']:<30} {p['reference']:<12} {p['rank']:>4} {p['max_loss_diff']:>12.2e} "
              f"{p['max_grad_diff']:>12.2e} {p['max_logprob_diff']:>12.2e}")
    print("CP=2: refused by config.validate:", *out["cp2_refusal"])


def _resume(model: str, ckpt: str, save: tuple[int, ...], load: tuple[int, ...]) -> dict:
    r = run_ranks(2, jobs.reshard_resume, model, ckpt, save, load, True, timeout=900)[0]
    out = {"losses_uninterrupted": [m["loss"] for m in r["uninterrupted"]],
           "losses_resumed": [m["loss"] for m in r["resumed"]]}
    out["max_loss_diff"] = max(abs(x - y) for x, y in zip(out["losses_uninterrupted"], out["losses_resumed"],
                                                          strict=True))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--optimizer", action="store_true", help="only the optimizer figures")
    ap.add_argument("--packing", action="store_true", help="only packed vs right-padded micro-batches")
    args = ap.parse_args()
    for k, v in {**loopback_env(), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}.items():
        os.environ.setdefault(k, v)
    if args.optimizer:
        with tempfile.TemporaryDirectory() as tmp:
            opt = optimizer_figures(str(make_hf_model(Path(tmp) / "hf", tied=True)), tmp)
        print(json.dumps(opt, indent=2)) if args.json else _print_optimizer(opt)
        return 0
    if args.packing:
        with tempfile.TemporaryDirectory() as tmp:
            packed = packing_parity(str(make_hf_model(Path(tmp) / "hf", tied=True)))
        if args.json:
            print(json.dumps(packed, indent=2))
        else:
            _print_packing(packed)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_hf_model(Path(tmp) / "hf", tied=True))
        one = run_ranks(1, jobs.training_parity, model, ONE_RANK, timeout=900)[0]
        two = run_ranks(2, jobs.training_parity, model, TWO_RANKS, timeout=900)
        four = run_ranks(4, jobs.training_parity, model, FOUR_RANKS, timeout=900)
        resumed = {"tp2dp1_to_tp1dp2": _resume(model, str(Path(tmp) / "ckpt"), (2, 1), (1, 2)),
                   "cp2_to_tp2": _resume(model, str(Path(tmp) / "ckpt_cp"), (1, 1, 2), (2, 1, 1))}
    runs = {**one, **two[0], **four[0]}
    parity = _parity(runs, PAIRS)
    memory = {"TP1 DP1": [one["TP1 DP1"]["bytes"]], "TP1 DP1 distopt": [one["TP1 DP1 distopt"]["bytes"]],
              **{k: [r[k]["bytes"] for r in two] for k in TWO_RANKS}}
    out = {"parity": parity, "allocated_bytes_per_rank": memory, "reshard_resume": resumed}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{'setup':<24} {'vs':<16} {'max |dloss|':>12} {'max |dgrad|':>12} {'max |dlogp|':>12}")
    for p in parity:
        dl, dg, dp = p["max_loss_diff"], p["max_grad_diff"], p["max_logprob_diff"]
        print(f"{p['setup']:<24} {p['reference']:<16} {dl:>12.2e} {dg:>12.2e} {dp:>12.2e}")
    print("\nallocated bytes per rank (weights / grads / optimizer state):")
    for k, v in memory.items():
        print(f"{k:<24} " + "  ".join(f"{b['weights']}/{b['grads']}/{b['optimizer']}" for b in v))
    for name, r in resumed.items():
        print(f"\ncheckpoint {name}: next two losses {r['losses_resumed']} vs uninterrupted "
              f"{r['losses_uninterrupted']}: max |dloss| {r['max_loss_diff']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
