"""Rollout throughput of one vs two RolloutInstance actors (one CPU core each), and weight_refresh time.

    .venv/bin/python benchmarks/rollout_throughput.py --json rollout.json [--sizes tiny,small] [--repeats 3]

For each model size a fresh model is built (`init-model`, no download) and two instances are started
once; every repeat then runs the same workload (P prompts x G samples, `ignore_eos`, T tokens each)
on one instance and split over two, side by side, and refreshes both instances' weights with a
numpy state dict (as the trainer sends them). Medians over repeats are reported; the 1-minute load
average is recorded because the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def run_size(size: str, args: argparse.Namespace, models_dir: Path) -> dict:
    import ray
    from safetensors.numpy import load_file

    from asp_npu.data.init_model import build_model_dir
    from asp_npu.data.tasks import make_prompts
    from asp_npu.rollout.engine import EngineSettings, SamplingSettings
    from asp_npu.rollout.instance import launch_instances

    model = models_dir / size
    if not model.exists():
        build_model_dir(model, size, seed=0)
    settings = EngineSettings(str(model), max_num_seqs=args.max_num_seqs, max_model_len=1024)
    sampling = SamplingSettings(max_tokens=args.max_tokens, ignore_eos=True, seed=1)
    t0 = time.time()
    actors = launch_instances(
        2, settings, sampling, kind="cpu", kv_cache_gib=1, admission="continuous", keep_polled=False
    )
    startup = time.time() - t0
    weights = {}
    for f in sorted(model.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    rows: dict[str, list[float]] = {"tok_s_1": [], "tok_s_2": [], "refresh_s": [], "refresh_load_s": []}
    try:
        items = make_prompts("count", args.prompts, seed=3)
        ray.get([a.add_prompts.remote(items) for a in actors])

        def units(part: list, base: int) -> list[dict]:
            return [
                {
                    "unit": base + k,
                    "samples": [{"prompt_id": p.prompt_id, "sample_idx": i} for i in range(args.group)],
                }
                for k, p in enumerate(part)
            ]

        def timed(plan: list[tuple[object, list[dict]]]) -> float:
            before = sum(ray.get(a.stats.remote())["tokens_generated"] for a, _ in plan)
            t = time.time()
            ray.get([a.submit_units.remote(u) for a, u in plan])
            ray.get([a.wait_idle.remote() for a, _ in plan])
            wall = time.time() - t
            after = sum(ray.get(a.stats.remote())["tokens_generated"] for a, _ in plan)
            return (after - before) / wall

        timed([(actors[0], units(items[:2], 0)), (actors[1], units(items[2:4], 0))])  # warm-up
        half = len(items) // 2
        for r in range(args.repeats):
            base = 1000 * (r + 1)
            rows["tok_s_1"].append(timed([(actors[0], units(items, base))]))
            rows["tok_s_2"].append(
                timed(
                    [
                        (actors[0], units(items[:half], base + 500)),
                        (actors[1], units(items[half:], base + 500)),
                    ]
                )
            )
            reps = ray.get([a.refresh_weights.remote(weights, r + 1) for a in actors])
            rows["refresh_s"].append(max(x["total_s"] for x in reps))
            rows["refresh_load_s"].append(max(x["load_s"] for x in reps))
    finally:
        ray.get([a.shutdown.remote() for a in actors])
        for a in actors:
            ray.kill(a)
    med = {k: statistics.median(v) for k, v in rows.items()}
    n_params = sum(int(v.size) for v in weights.values())
    return {
        "size": size,
        "params": n_params,
        "startup_s": startup,
        "runs": rows,
        "median": med,
        "speedup_2_vs_1": med["tok_s_2"] / med["tok_s_1"],
        "tokens_per_run": args.prompts * args.group * args.max_tokens,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="write results here")
    parser.add_argument("--sizes", default="tiny,small")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--models-dir", default="", help="reuse/build models here (default: a temp dir)")
    args = parser.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    import ray

    from asp_npu.io import atomic_write_json, check_writable

    check_writable(args.json)
    tmp = tempfile.TemporaryDirectory(prefix="asp-bench-")
    models_dir = Path(args.models_dir or tmp.name)
    models_dir.mkdir(parents=True, exist_ok=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    results = []
    try:
        for size in args.sizes.split(","):
            load_before = os.getloadavg()[0]
            res = run_size(size, args, models_dir)
            res["loadavg_1m"] = [load_before, os.getloadavg()[0]]
            results.append(res)
            m = res["median"]
            print(
                f"{size:>5} ({res['params'] / 1e6:.2f}M): 1 instance {m['tok_s_1']:,.0f} tok/s, "
                f"2 instances {m['tok_s_2']:,.0f} tok/s (x{res['speedup_2_vs_1']:.2f}), "
                f"refresh {m['refresh_s'] * 1e3:.0f} ms (load {m['refresh_load_s'] * 1e3:.0f} ms), "
                f"load avg {res['loadavg_1m'][0]:.1f}->{res['loadavg_1m'][1]:.1f}",
                flush=True,
            )
    finally:
        ray.shutdown()
        tmp.cleanup()
    atomic_write_json(
        args.json,
        {
            "benchmark": "rollout_throughput",
            "args": vars(args),
            "results": results,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        indent=1,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
