"""Sensitivity of the `paper` comparison: trainer cost x lag bound x partial rollout, every mode.

The trainer cost runs from the FLOP-derived 8.1e-4 device-s/token (10 x 7.6e9 FLOP/token at 313
TFLOPS x 30% MFU: `paper`'s `sources.train_s_per_token`) to the calibrated 3.4e-3 (rollout = 70% of
the `mindspeed-sync` iteration, SortedRL / ANCHORS; `paper`'s default). docs/simulator.md has both.
For every point: each mode's mean iteration time with partial rollout off, the asynchronous
disaggregated modes with it on (`<mode>+partial`), ASP against the best baseline (same partial
setting; the synchronous and colocated baselines have no partial rollout and count as they are),
and the efficiency (iteration time over the limit, `asp_npu.sim.limit`) of ASP.

    .venv/bin/python benchmarks/sim_sensitivity.py [--costs 8.1e-4,3.4e-3] [--lags 1,2,3,4]
                                                   [--max-token-lag N] [--iterations 50]
                                                   [--split rule|search] [--json F]
                                                   [--traces ours|lognormal-heavy,bimodal,drift,near-uniform]

`--traces` runs the same table on length traces NOT from our generator (`benchmarks/sim_traces.py`'s
shapes, written to JSONL and given to the preset as its trace); `ours` (default) is the preset's own
generator. Deterministic (virtual clock); prints one Markdown table per trace.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sim_traces  # noqa: E402

from asp_npu.data.traces import write_trace  # noqa: E402
from asp_npu.io import atomic_write_json  # noqa: E402
from asp_npu.sim.modes import MODES, partial_allowed  # noqa: E402
from asp_npu.sim.preset import load_preset  # noqa: E402
from asp_npu.sim.run import build_workload, simulate  # noqa: E402


def point(
    cost: float, lag: int, token_lag: int | None, iterations: int | None, split: str | None,
    trace: str | None = None,
) -> dict[str, dict]:
    """Every mode (and `<mode>+partial` where it applies) at one (trainer cost, max_lag) point."""
    over: dict = {"cost.train_s_per_token": cost, "max_lag": lag}
    if split:
        over["cluster.split"] = split
    if token_lag is not None:
        over["max_token_lag"] = token_lag
    preset = load_preset("paper", iterations=iterations, trace=trace, overrides=over)
    workload = build_workload(preset)
    on = replace(preset, rl=replace(preset.rl, partial_rollout=True))
    out = {}
    for m in MODES:
        out[m] = simulate(preset, workload, m).metrics
        if partial_allowed(m):
            out[f"{m}+partial"] = simulate(on, workload, m).metrics
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--costs", default="8.1e-4,3.4e-3", help="trainer device-s per token")
    ap.add_argument("--lags", default="1,2,3,4")
    ap.add_argument("--max-token-lag", type=int, default=None, help="default: 4 x max_lag")
    ap.add_argument("--iterations", type=int, default=None, help="default: the preset's 50")
    ap.add_argument("--split", choices=("rule", "search"), help="device split (default: the preset's search)")
    ap.add_argument("--json", help="write every point's metrics")
    ap.add_argument("--traces", default="ours", help="ours, or shapes of benchmarks/sim_traces.py")
    args = ap.parse_args()
    names = [x for x in args.traces.split(",") if x]
    doc: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        shapes = sim_traces.make_traces() if names != ["ours"] else {}
        for name in names:
            path = None
            if name != "ours":
                path = str(Path(tmp) / f"{name}.jsonl")
                write_trace(shapes[name], path)
            print(f"\n### trace: {name}\n")
            doc[name] = table(args, path)
    if args.json:
        atomic_write_json(args.json, doc, indent=1)


def table(args: argparse.Namespace, trace: str | None) -> dict:
    """Every (cost, lag) point on one trace; prints its table, returns the metrics."""
    costs = [float(x) for x in args.costs.split(",")]
    lags = [int(x) for x in args.lags.split(",")]
    t0 = time.perf_counter()
    rows, doc = [], {}
    for c in costs:
        for lag in lags:
            r = point(c, lag, args.max_token_lag, args.iterations, args.split, trace)
            print(f"point {c:g}/{lag} done at {time.perf_counter() - t0:.0f} s", flush=True)
            doc[f"{c:g}/{lag}"] = r
            it = {m: x["iteration_time_mean_s"] for m, x in r.items()}
            base_off = {m: it[m] for m in MODES if m != "asp"}
            best_off = min(base_off, key=base_off.get)
            base_on = {m: it.get(f"{m}+partial", it[m]) for m in MODES if m != "asp"}
            best_on = min(base_on, key=base_on.get)
            key = "asp+partial"
            rows.append(
                f"| {c:g} | {lag} | "
                + " | ".join(f"{it[m]:.0f}" for m in MODES)
                + f" | {it[key]:.0f} | {it['async-fifo+partial']:.0f} | "
                f"{100 * (it[key] / it['asp'] - 1):+.1f}% | "
                f"{100 * (it['asp'] / base_off[best_off] - 1):+.1f}% ({best_off}) | "
                f"{100 * (it[key] / base_on[best_on] - 1):+.1f}% ({best_on}) | "
                f"{r['asp']['efficiency']:.2f} / {r[key]['efficiency']:.2f} | "
                f"{r[key]['token_lag']['mean']:.2f}/{r[key]['token_lag']['max']} |"
            )
    head = (
        "| train s/token | max_lag | " + " | ".join(MODES) + " | asp+partial | async-fifo+partial | "
        "partial cut (asp) | asp vs best baseline (off) | asp+partial vs best baseline (on) | "
        "asp x limit off/on | asp+partial token lag mean/max |"
    )
    print("mean iteration time (s), `paper` preset; baselines 'on' = their +partial run where they have one")
    print()
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    print("\n".join(rows))
    print(f"\n{len(rows)} points in {time.perf_counter() - t0:.0f} s")
    return doc


if __name__ == "__main__":
    main()
