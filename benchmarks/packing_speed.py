"""Trainer tokens/s packed (`actor_config.use_remove_padding: true`) vs right-padded, side by side in one
process, and the simulator's predicted gain beside the measured one.

Usage: .venv/bin/python benchmarks/packing_speed.py [--runs 3] [--steps 4] [--size tiny|small]
       [--groups 4] [--group-size 8] [--micro-batch-size 8] [--max-token-len 0] [--tail-sigma 1.2]
       [--threads 1] [--calib calib.json] [--json out.json]

One megatron-core trainer rank (`TrainerWorker`, world size 1, gloo, no Ray) on a freshly built model
(`asp-npu init-model` tiny/small) trains GRPO steps on long-tailed synthetic minibatches (prompt 16-32
tokens, responses lognormal with median 64 tokens and log-sd `--tail-sigma`, capped at 512; the
batches of `benchmarks/trainer_throughput.py`). The rank is built packed (its core attention honours
sequence boundaries; a padded micro-batch runs megatron's own attention unchanged) and every step is
taken twice on the same minibatch, padded and packed, in alternating order (padded first on even
steps), so both see the same weights and the same machine load step by step. tokens/s counts real
tokens (never padding). Per run: the median over its steps; over runs: the median, and the median
of the per-run packed / padded ratios; the same in process CPU time (real tokens over the step's CPU
seconds of this one-thread process), which other processes on a loaded machine disturb far less than
wall time. One warm-up step of each kind is not counted.

The simulator's prediction uses its trainer cost (`asp_npu.sim.cost.train_seconds`, one rank of
`--threads` devices): packed = the real tokens, padded = the slots of the same length-sorted
micro-batches; the gain is padded seconds / packed seconds - with no fixed cost per step (the slot
ratio), and with the calibration's `trainer_step_s` and `trainer_s_per_token` when `--calib` is given.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from asp_npu.device import loopback_env  # noqa: E402


def predicted(batches: list, mbs: int, budget: int, threads: int, step_s: float, per_token: float) -> float:
    """The simulator's padded / packed trainer seconds over the timed minibatches."""
    from dataclasses import replace

    from asp_npu.sim.cost import SimCost, train_seconds

    cost = SimCost(train_s_per_token=per_token, train_step_s=step_s, train_dp_devices=threads,
                   micro_batch_size=mbs, train_max_token_len=budget)
    secs = {True: 0.0, False: 0.0}
    for b in batches:
        tokens = np.array([len(t.prompt_token_ids) + len(t.response_token_ids) - 1 for t in b.trajectories])
        for packed in secs:
            secs[packed] += train_seconds(replace(cost, train_packed=packed), tokens, threads, False)[0]
    return secs[False] / secs[True]


def measure(model: str, batches: list, args: argparse.Namespace) -> list[dict[str, list[float]]]:
    """Per run: the tokens/s of every timed step, padded and packed."""
    from asp_npu.config import Config
    from asp_npu.net import free_port
    from asp_npu.trainer.worker import TrainerWorker

    packed = Config()
    packed.model.path, packed.trainer.device = model, "cpu"
    a = packed.actor_config
    a.micro_batch_size, a.num_threads, a.use_remove_padding = args.micro_batch_size, args.threads, True
    a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu = args.max_token_len > 0, max(1, args.max_token_len)
    padded = copy.deepcopy(packed)
    padded.actor_config.use_remove_padding = False
    w = TrainerWorker(packed, 0, 1, master_port=free_port())
    cfgs = {"padded": padded, "packed": packed}
    for name in cfgs:  # warm-up, one step of each kind
        w.cfg = cfgs[name]
        w.train_step(batches[0])
    runs = []
    for r in range(args.runs):
        got: dict[str, list[float]] = {k: [] for k in ("padded", "packed", "padded_cpu", "packed_cpu")}
        for i, b in enumerate(batches[1:]):
            for name in (("padded", "packed") if (r + i) % 2 == 0 else ("packed", "padded")):
                w.cfg = cfgs[name]  # the worker reads use_remove_padding per step
                for t in b.trajectories:
                    t.policy_version = w.version
                cpu = time.process_time()
                m = w.train_step(b)
                got[name].append(m["tokens_per_s"])
                got[name + "_cpu"].append(m["tokens_per_s"] * m["step_time_s"] / (time.process_time() - cpu))
        runs.append(got)
        print(f"run {r + 1}/{args.runs}: padded {statistics.median(got['padded']):.0f}, packed "
              f"{statistics.median(got['packed']):.0f} tokens/s (load average {os.getloadavg()[0]:.1f})",
              file=sys.stderr)
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="timed minibatches per run (each padded and packed)")
    ap.add_argument("--size", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--max-token-len", type=int, default=0,
                    help="use_dynamic_bsz budget (0 = micro_batch_size)")
    ap.add_argument("--tail-sigma", type=float, default=1.2, help="log-sd of the response lengths")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the rank (= its devices)")
    ap.add_argument("--calib", default="", help="asp-calib/1 file: its trainer costs for the prediction")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    for k, v in {**loopback_env(), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}.items():
        os.environ.setdefault(k, v)
    from trainer_throughput import synthetic_batch, token_slots

    load0, t0 = os.getloadavg()[0], time.time()
    with tempfile.TemporaryDirectory() as tmp:
        from asp_npu.data.init_model import build_model_dir

        model = str(build_model_dir(Path(tmp) / "model", args.size))
        vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
        batches = [synthetic_batch(vocab, args.groups, args.group_size, i, args.tail_sigma)
                   for i in range(args.steps + 1)]
        runs = measure(model, batches, args)
    med = {k: statistics.median(statistics.median(r[k]) for r in runs) for k in runs[0]}
    ratios = [statistics.median(r["packed"]) / statistics.median(r["padded"]) for r in runs]
    cpu_ratios = [statistics.median(r["packed_cpu"]) / statistics.median(r["padded_cpu"]) for r in runs]
    mbs, budget = args.micro_batch_size, args.max_token_len
    pred = {"slots": predicted(batches[1:], mbs, budget, args.threads, 0.0, 1.0)}
    if args.calib:
        c = json.loads(Path(args.calib).read_text())
        step_s, per_token = float(c["trainer_step_s"] or 0.0), float(c["trainer_s_per_token"])
        pred["calibrated"] = predicted(batches[1:], mbs, budget, args.threads, step_s, per_token)
    out = {"size": args.size, "runs": args.runs, "steps": args.steps, "tail_sigma": args.tail_sigma,
           "micro_batch_size": args.micro_batch_size, "max_token_len": args.max_token_len,
           "threads": args.threads, "token_slots": token_slots(batches, mbs, budget),
           "tokens_per_s_median": med, "tokens_per_s_runs": [{k: statistics.median(v) for k, v in r.items()}
                                                             for r in runs],
           "measured_gain_median": statistics.median(ratios), "measured_gain_runs": ratios,
           "measured_gain_cpu_time_median": statistics.median(cpu_ratios),
           "measured_gain_cpu_time_runs": cpu_ratios,
           "predicted_gain": pred, "loadavg_1m": [load0, os.getloadavg()[0]], "wall_s": time.time() - t0,
           "cpu_count": os.cpu_count()}
    def runs_text(xs: list[float]) -> str:
        return ", ".join(f"{x:.2f}" for x in xs)

    print(f"padded {med['padded']:.0f} tokens/s, packed {med['packed']:.0f} tokens/s: measured gain "
          f"x{out['measured_gain_median']:.2f} (runs {runs_text(ratios)}), in process CPU time "
          f"x{out['measured_gain_cpu_time_median']:.2f} (runs {runs_text(cpu_ratios)}); simulator "
          + ", ".join(f"x{v:.2f} ({k})" for k, v in pred.items())
          + f"; load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
