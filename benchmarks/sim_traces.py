"""ASP vs async-fifo (stream executor) on length traces that do NOT come from our generator, per lag bound.

Builds four trace shapes inside the script (none uses `asp_npu.data.traces.synth_trace`), writes each
as JSONL and runs the `paper` preset on it (`--trace`), async-fifo and asp side by side:

- `lognormal-heavy`: per-prompt lognormal centre (sigma 0.9 across prompts), samples lognormal around
  it with sigma 1.0 (heavier tail than the generator), capped at 16k;
- `bimodal`: 70% "short" prompts (gamma, mean 600) and 30% "long" prompts (gamma, mean 7000), cap 16k;
- `drift`: per-prompt lognormal with the whole population growing 30% per epoch (length drift in RL);
- `near-uniform`: every sample uniform in [1800, 2200] (nothing for a length scheduler to exploit).

    .venv/bin/python benchmarks/sim_traces.py [--lags 1,2,4,8] [--iterations 30] [--split rule]

Deterministic (virtual clock); prints one Markdown table.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from asp_npu.data.traces import Trace, write_trace
from asp_npu.sim.preset import load_preset
from asp_npu.sim.run import build_workload, simulate

CAP = 16384


def _trace(lengths: np.ndarray, prompt_len: np.ndarray, name: str) -> Trace:
    """lengths: (epochs, prompts, n) -> Trace."""
    e, p, n = lengths.shape
    epoch, prompt, sample = np.meshgrid(np.arange(e), np.arange(p), np.arange(n), indexing="ij")
    return Trace(
        np.array([f"{name}-{i}" for i in range(p)]),
        prompt.ravel().astype(np.int64),
        epoch.ravel().astype(np.int64),
        sample.ravel().astype(np.int64),
        prompt_len[prompt.ravel()].astype(np.int64),
        np.clip(np.rint(lengths.ravel()), 1, CAP).astype(np.int64),
        name,
    )


def make_traces(prompts: int = 1024, epochs: int = 7, n: int = 8, seed: int = 1) -> dict[str, Trace]:
    rng = np.random.default_rng(seed)
    shape = (epochs, prompts, n)
    plen = rng.integers(60, 600, prompts)
    out: dict[str, Trace] = {}
    centre = rng.normal(np.log(1500), 0.9, prompts)
    out["lognormal-heavy"] = _trace(
        np.exp(centre[None, :, None] + rng.normal(0, 1.0, shape)), plen, "lognormal-heavy"
    )
    long = rng.random(prompts) < 0.3
    mean = np.where(long, 7000.0, 600.0)
    out["bimodal"] = _trace(rng.gamma(4.0, mean[None, :, None] / 4.0, shape), plen, "bimodal")
    growth = 1.3 ** np.arange(epochs)
    centre_d = rng.normal(np.log(1000), 0.7, prompts)
    out["drift"] = _trace(
        growth[:, None, None] * np.exp(centre_d[None, :, None] + rng.normal(0, 0.6, shape)), plen, "drift"
    )
    out["near-uniform"] = _trace(rng.uniform(1800, 2200, shape), plen, "near-uniform")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lags", default="1,2,4,8")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--split", default="rule", choices=("rule", "search"))
    ap.add_argument("--predictor", default="history")
    args = ap.parse_args()
    lags = [int(x) for x in args.lags.split(",")]
    print("| trace | max_lag | async-fifo tok/s | asp tok/s | asp iter vs async-fifo | lag max fifo/asp |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, tr in make_traces().items():
            path = Path(tmp) / f"{name}.jsonl"
            write_trace(tr, path)
            for lag in lags:
                preset = load_preset(
                    "paper",
                    iterations=args.iterations,
                    trace=str(path),
                    overrides={"max_lag": lag, "cluster.split": args.split, "predictor": args.predictor},
                )
                w = build_workload(preset)
                f = simulate(preset, w, "async-fifo").metrics
                a = simulate(preset, w, "asp").metrics
                change = a["iteration_time_mean_s"] / f["iteration_time_mean_s"] - 1
                tf, ta = f["throughput_tokens_per_s"], a["throughput_tokens_per_s"]
                print(
                    f"| {name} | {lag} | {tf:.0f} | {ta:.0f} | {change * 100:+.1f}% "
                    f"| {f['lag_max']}/{a['lag_max']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
