"""Trainer throughput (tokens/s of GRPO train_step) of the megatron-core trainer at several TP/PP/DP layouts.

Usage: .venv/bin/python benchmarks/trainer_throughput.py [--layouts 1x1x1,2x1x1] [--steps 8] [--runs 3]
       [--size tiny] [--groups 4] [--group-size 8] [--micro-batch-size 8] [--threads 0] [--json]
       [--dtype float32] [--distributed-optimizer] [--sequence-parallel] [--recompute full|selective]
       [--packing] [--tail-sigma 0.6] [--count-only]

Every layout runs as a Ray actor group (`asp_npu.trainer.group.TrainerGroup`) on the same model
(`asp-npu init-model` tiny/small, built into a temp folder) and the same synthetic batches
(prompt ~24 tokens, response lengths lognormal with median 64 tokens and log-sd `--tail-sigma`, capped
at 512). Layouts are interleaved run by run (A B A B ...), so machine noise hits them alike; each cell
is the median over runs of the median step after one warm-up step. tokens/s counts prompt+response
tokens processed (real tokens, never padding). `--packing` runs every layout twice, right-padded
micro-batches and packed ones (`actor_config.use_remove_padding`), interleaved, side by side, and
reports the token slots each computes per step (deterministic; `--count-only` prints just those).
`--ab-baseline DIR` instead compares TP=1 `train_step` of this checkout with another one (e.g. the
main branch: `git worktree add /tmp/base main`): one trainer process per checkout, steps taken in
strict alternation A B A B ... on the same batches, so both see the same machine load step by step;
it reports each side's median tokens/s, the median of the paired per-step ratios new/baseline (also
in process CPU time, which a loaded machine disturbs less), and how each step splits into the
forward/backward schedule and the rest (gradient reduction + optimizer update).

Each layout also reports every rank's allocated bytes of weights, gradients and optimizer state
after the last step (`asp_npu.trainer.memory.allocated_bytes`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asp_npu.device import loopback_env  # noqa: E402
from asp_npu.types import TrainBatch, Trajectory  # noqa: E402


def synthetic_batch(vocab: int, groups: int, group_size: int, seed: int, sigma: float = 0.6) -> TrainBatch:
    rng = random.Random(seed)
    trajs = []
    for g in range(groups):
        prompt = [rng.randrange(10, vocab) for _ in range(rng.randint(16, 32))]
        for s in range(group_size):
            n = int(min(512, max(4, rng.lognormvariate(4.16, sigma))))  # median e^4.16 ~ 64 tokens
            resp = [rng.randrange(10, vocab) for _ in range(n)]
            trajs.append(
                Trajectory(f"b{seed}-g{g}", s, prompt, resp, [-6.0] * n, "stop", float(rng.random() < 0.5), 0)
            )
    return TrainBatch(trajs, group_size)


def measure(
    model_dir: str, layout: tuple[int, int, int], batches: list[TrainBatch], mbs: int, threads: int,
    max_token_len: int = 0, features: dict | None = None, dtype: str = "float32",
) -> dict:
    from asp_npu.config import Config
    from asp_npu.trainer.group import TrainerGroup

    cfg = Config()
    cfg.model.path = model_dir
    cfg.trainer.device = "cpu"
    a = cfg.actor_config
    a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.data_parallel_size = layout
    a.micro_batch_size = mbs
    a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu = max_token_len > 0, max(1, max_token_len)
    a.num_threads = threads or max(1, (os.cpu_count() or 1) // (layout[0] * layout[1] * layout[2]))
    cfg.model.dtype = dtype
    for k, v in (features or {}).items():
        setattr(a, k, v)
    a.sequence_parallel = a.sequence_parallel and layout[0] > 1  # needs TP > 1
    group = TrainerGroup(cfg, cpus_per_rank=0)
    try:
        group.train_step(batches[0])  # warm-up
        steps = [group.train_step(b) for b in batches[1:]]
        allocated = group.allocated_bytes()
    finally:
        group.shutdown()
    return {
        "tokens_per_s": statistics.median(m["tokens_per_s"] for m in steps),
        "step_time_s": statistics.median(m["step_time_s"] for m in steps),
        "allocated_bytes": allocated,
    }


def token_slots(batches: list[TrainBatch], mbs: int, max_token_len: int) -> dict:
    """Token positions the trainer computes over `batches` (after the warm-up one): real tokens, right-
    padded micro-batches (length-sorted, `use_dynamic_bsz` when `max_token_len`), packed streams."""
    from asp_npu.trainer.batching import batch_to_samples, make_micro_batches
    from asp_npu.trainer.packing import packed_micro_batches

    out = {"real": 0, "padded": 0, "packed": 0}
    for b in batches[1:]:
        samples, _ = batch_to_samples(b, drop_equal_groups=False)
        out["real"] += sum(s.length for s in samples)
        for key, build in (("padded", make_micro_batches), ("packed", packed_micro_batches)):
            out[key] += sum(mb["input_ids"].numel() for mb in build(samples, mbs, max_token_len))
    return {**out, "padded_over_real": out["padded"] / max(out["real"], 1)}


AB_CHILD = r"""
import json, sys, time
import torch
from asp_npu.config import Config
from asp_npu.net import free_port
from asp_npu.trainer.worker import TrainerWorker
from asp_npu.types import TrainBatch, Trajectory
model, batches_path, mbs, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cfg = Config()
cfg.model.path, cfg.trainer.device = model, "cpu"
cfg.actor_config.micro_batch_size, cfg.actor_config.num_threads = mbs, threads
w = TrainerWorker(cfg, 0, 1, master_port=free_port())
batches = [TrainBatch([Trajectory(**t) for t in b["trajectories"]], b["group_size"])
           for b in json.load(open(batches_path))]
schedule = [0.0]
run_schedule = w._run_schedule


def timed_schedule(*args, **kwargs):
    t = time.perf_counter()
    try:
        return run_schedule(*args, **kwargs)
    finally:
        schedule[0] += time.perf_counter() - t


w._run_schedule = timed_schedule
print("ready", flush=True)
for line in sys.stdin:
    schedule[0], cpu = 0.0, time.process_time()
    m = w.train_step(batches[int(line)])
    print(json.dumps({"tokens_per_s": m["tokens_per_s"], "step_time_s": m["step_time_s"],
                      "cpu_s": time.process_time() - cpu, "schedule_s": schedule[0]}), flush=True)
"""


def ab_compare(baseline: str, model: str, batches: list[TrainBatch], mbs: int, threads: int,
               rounds: int) -> dict:
    """Baseline checkout vs this one at TP=1, steps alternating between their two processes."""
    import dataclasses
    import subprocess

    here = str(Path(__file__).resolve().parents[1])
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([{"trajectories": [dataclasses.asdict(t) for t in b.trajectories],
                    "group_size": b.group_size} for b in batches], f)
    procs = {}
    for name, tree in (("baseline", str(Path(baseline).resolve())), ("new", here)):
        env = {**os.environ, "PYTHONPATH": tree}
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", AB_CHILD, model, f.name, str(mbs), str(threads or os.cpu_count() or 1)],
            cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True)
    res: dict[str, list[dict]] = {"baseline": [], "new": []}
    try:
        for p in procs.values():
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for r in range(rounds):
            for i in range(len(batches)):
                for name in (("baseline", "new") if (r + i) % 2 == 0 else ("new", "baseline")):
                    p = procs[name]
                    assert p.stdin is not None and p.stdout is not None
                    p.stdin.write(f"{i}\n")
                    p.stdin.flush()
                    m = json.loads(p.stdout.readline())
                    if i > 0 or r > 0:  # the very first step of each process warms up
                        res[name].append(m)
    finally:
        for p in procs.values():
            if p.stdin:
                p.stdin.close()
            p.wait(timeout=60)
        os.unlink(f.name)
    def med(name: str, key: str) -> float:
        return statistics.median(m[key] for m in res[name])

    ratios = [n["tokens_per_s"] / b["tokens_per_s"] for n, b in zip(res["new"], res["baseline"], strict=True)]
    cpu_ratios = [b["cpu_s"] / n["cpu_s"] for n, b in zip(res["new"], res["baseline"], strict=True)]
    return {"baseline_tokens_per_s_median": med("baseline", "tokens_per_s"),
            "new_tokens_per_s_median": med("new", "tokens_per_s"),
            "paired_ratio_median": statistics.median(ratios), "pairs": len(ratios),
            "ratio_quartiles": statistics.quantiles(ratios, n=4),
            "paired_cpu_time_ratio_median": statistics.median(cpu_ratios),
            "cpu_time_ratio_quartiles": statistics.quantiles(cpu_ratios, n=4),
            "step_s_median": {k: med(k, "step_time_s") for k in res},
            "schedule_s_median": {k: med(k, "schedule_s") for k in res},
            "update_s_median": {k: statistics.median(m["step_time_s"] - m["schedule_s"] for m in res[k])
                                for k in res}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", default="1x1x1,2x1x1", help="comma list of TPxPPxDP")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per run (after one warm-up)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--size", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--model", default="", help="existing HF folder instead of building --size")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per rank (0 = cores / ranks)")
    ap.add_argument("--max-token-len", type=int, default=0,
                    help="use_dynamic_bsz with this ppo_max_token_len_per_gpu (0 = micro_batch_size)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--distributed-optimizer", action="store_true",
                    help="actor_config.use_distributed_optimizer")
    ap.add_argument("--sequence-parallel", action="store_true", help="on layouts with TP > 1")
    ap.add_argument("--recompute", default="", choices=["", "full", "selective"],
                    help="actor_config.recompute_granularity (full: uniform, 1 layer per chunk)")
    ap.add_argument("--packing", action="store_true",
                    help="each layout right-padded and packed (use_remove_padding), side by side")
    ap.add_argument("--tail-sigma", type=float, default=0.6,
                    help="log-sd of the response lengths (larger: a longer tail)")
    ap.add_argument("--count-only", action="store_true",
                    help="print the token slots padded vs packed (deterministic) and start no trainer")
    ap.add_argument("--ab-baseline", default="", help="another checkout to compare with at TP=1 (see above)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    for k, v in {
        **loopback_env(),
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
    }.items():
        os.environ.setdefault(k, v)
    layouts = [tuple(int(x) for x in s.split("x")) for s in args.layouts.split(",")]
    features = {"use_distributed_optimizer": args.distributed_optimizer,
                "sequence_parallel": args.sequence_parallel, "recompute_granularity": args.recompute}
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if not model:
            from asp_npu.data.init_model import build_model_dir

            model = str(build_model_dir(Path(tmp) / "model", args.size))
        vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
        batches = [synthetic_batch(vocab, args.groups, args.group_size, i, args.tail_sigma)
                   for i in range(args.steps + 1)]
        slots = token_slots(batches, args.micro_batch_size, args.max_token_len)
        if args.count_only:
            print(json.dumps({"tail_sigma": args.tail_sigma, "steps": args.steps, "token_slots": slots}))
            return 0
        if args.ab_baseline:
            ab = ab_compare(args.ab_baseline, model, batches, args.micro_batch_size, args.threads, args.runs)
            print(json.dumps({"size": args.size, "steps": args.steps, "rounds": args.runs, **ab}, indent=2))
            return 0
        variants = {" padded": False, " packed": True} if args.packing else {"": False}
        runs: dict[str, list[dict]] = {"x".join(map(str, lay)) + v: [] for lay in layouts for v in variants}
        for r in range(args.runs):
            for lay in layouts:
                for v, packed in variants.items():
                    res = measure(model, lay, batches, args.micro_batch_size,  # type: ignore[arg-type]
                                  args.threads, args.max_token_len,
                                  {**features, "use_remove_padding": packed}, args.dtype)
                    runs["x".join(map(str, lay)) + v].append(res)
                    if not args.json:
                        print(f"run {r + 1}/{args.runs} TPxPPxDP={'x'.join(map(str, lay))}{v}: "
                              f"{res['tokens_per_s']:.0f} tokens/s, {res['step_time_s']:.3f} s/step",
                              file=sys.stderr)
    tokens = sum(len(t.prompt_token_ids) + len(t.response_token_ids) - 1 for t in batches[1].trajectories)
    summary = {
        "size": args.size if not args.model else args.model,
        "samples_per_step": args.groups * args.group_size,
        "tokens_per_step_example": tokens,
        "runs": args.runs,
        "dtype": args.dtype,
        "features": features,
        "tail_sigma": args.tail_sigma,
        "token_slots": slots,
        "steps": args.steps,
        "layouts": {
            k: {
                "tokens_per_s_median": statistics.median(x["tokens_per_s"] for x in v),
                "step_time_s_median": statistics.median(x["step_time_s"] for x in v),
                "tokens_per_s_runs": [round(x["tokens_per_s"]) for x in v],
                "allocated_bytes_per_rank": v[-1]["allocated_bytes"],
            }
            for k, v in runs.items()
        },
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{'TPxPPxDP':>16} {'tokens/s':>10} {'s/step':>8}  runs")
        for k, v in summary["layouts"].items():
            tps, sec = v["tokens_per_s_median"], v["step_time_s_median"]
            print(f"{k:>16} {tps:>10.0f} {sec:>8.3f}  {v['tokens_per_s_runs']}")
        print(f"token slots over the timed steps: {slots}")
        print("allocated bytes per rank (weights / grads / optimizer state):")
        for k, v in summary["layouts"].items():
            print(f"{k:>16} " + "  ".join(f"{b['weights']}/{b['grads']}/{b['optimizer']}"
                                         for b in v["allocated_bytes_per_rank"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
