"""Simulator speed: 100 iterations of 1,024 samples (128 prompts x 8) on 16 rollout instances, one core.

Target (issue 3): under 30 s per mode. Pins itself to one CPU core, runs every mode `--repeats`
times on the `paper` preset (responses up to 16k tokens) and prints the median seconds per mode.

    .venv/bin/python benchmarks/sim_speed.py [--iterations 100] [--instances 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from asp_npu.sim.modes import MODES
from asp_npu.sim.preset import load_preset
from asp_npu.sim.run import build_workload, simulate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--instances", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--preset", default="paper")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    preset = load_preset(args.preset, iterations=args.iterations)
    t0 = time.perf_counter()
    workload = build_workload(preset)
    per_iter = workload.prompts_per_iteration * workload.group_size
    print(
        f"workload: {workload.num_iterations} iterations x {per_iter} samples, "
        f"{workload.total_response_tokens:,} response tokens (built in {time.perf_counter() - t0:.1f} s)"
    )
    print(f"| mode | instances | median s ({args.repeats} runs) | min s | max s | events/s |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for mode in MODES:
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            run = simulate(preset, workload, mode, instances=args.instances)
            times.append(time.perf_counter() - t)
        med = statistics.median(times)
        worst = max(worst, med)
        events = len(run.result.log.inst) + len(run.result.log.trainer)
        print(
            f"| {mode} | {run.layout.instances} | {med:.2f} | {min(times):.2f} | {max(times):.2f} | "
            f"{events / med:,.0f} |"
        )
    print(f"slowest mode median: {worst:.2f} s (target < 30 s)")


if __name__ == "__main__":
    main()
