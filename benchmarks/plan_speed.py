"""Planning speed at 1,000,000 samples: `plan_seconds`, whole-command wall time and peak RSS.

Usage: .venv/bin/python benchmarks/plan_speed.py [--repeats 3] [--instances 8,16,64]

Writes a 2-epoch trace (62,500 prompts x 16 samples per epoch) to a temp folder, then runs the real
CLI (`python -m asp_npu.cli plan ... --epoch 1 --out plan.json --json`: parsing, history prediction,
planning and the streamed plan file) under `/usr/bin/time -v`, pinned to one core with `taskset -c 0`
when available, and reports the median of `--repeats` runs per setting.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_once(trace: Path, out: Path, k: int, minibatch: int, max_num_seqs: int) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "asp_npu.cli",
        "plan",
        "--trace",
        str(trace),
        "--epoch",
        "1",
        "--instances",
        str(k),
        "--minibatch",
        str(minibatch),
        "--max-num-seqs",
        str(max_num_seqs),
        "--out",
        str(out),
        "--json",
    ]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(r.stderr)
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    cpu = sum(
        float(re.search(rf"{k} time \(seconds\): ([\d.]+)", r.stderr).group(1)) for k in ("User", "System")
    )
    return {
        "plan_seconds": summary["plan_seconds"],
        "plan_cpu_seconds": summary["plan_cpu_seconds"],
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_mb": rss_kb / 1024,
        "units": summary["units"],
        "samples": summary["samples"],
        "plan_mb": out.stat().st_size / 2**20,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--instances", default="8,16,64")
    ap.add_argument("--minibatch", type=int, default=1024)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "asp_npu.cli",
                "trace",
                "synth",
                "--prompts",
                "62500",
                "--epochs",
                "2",
                "--n",
                "16",
                "--seed",
                "0",
                "--out",
                str(trace),
            ],
            check=True,
            cwd=ROOT,
            capture_output=True,
        )
        settings = [(int(k), a.minibatch, 256) for k in a.instances.split(",")]
        settings.append((64, 16, 16))  # worst case: one group per unit, 62,500 units
        for k, mb, seqs in settings:
            runs = [run_once(trace, Path(tmp) / "plan.json", k, mb, seqs) for _ in range(a.repeats)]
            med = {key: round(statistics.median(r[key] for r in runs), 3) for key in runs[0]}
            rows.append({"instances": k, "minibatch": mb, "max_num_seqs": seqs, "repeats": a.repeats, **med})
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        "| K | minibatch | max_num_seqs | units | plan_seconds (cpu) | command wall s (cpu) | peak RSS MB "
        "| plan MB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['instances']} | {r['minibatch']} | {r['max_num_seqs']} | {int(r['units'])} "
            f"| {r['plan_seconds']} ({r['plan_cpu_seconds']}) "
            f"| {r['wall_s']:.2f} ({r['cpu_s']:.2f}) | {r['peak_rss_mb']:.0f} | {r['plan_mb']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
