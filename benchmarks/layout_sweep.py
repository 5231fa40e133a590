"""Issue #26's sweep: the `paper` preset at 1-16 instances (equal device count per point), ASP with
`layout: auto` against every baseline, at both ends of the trainer-cost band 8.1e-4 .. 3.4e-3 s/token
(3.4e-3 is the preset's own); prints one markdown row per point (deterministic).

Besides `x limit` and `x hardware`, each row gives the lag floor over the hardware bound
(`sim/limit.py`: the longest sample at batch 1 spread over the lag bound's `max_lag + 1` versions; above
1.05 no lag-bounded schedule on any split can be within 1.05x of `x hardware`) and, labelled apart,
ASP with `layout: auto` and `rl.partial_rollout: true` (a different staleness rule: the user's choice,
not the layout's; tokens within 4 x max_lag versions).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/layout_sweep.py [--costs 3.4e-3,8.1e-4]
                                    [--instances 1,2,4,8,16] [--preset paper]
"""

from __future__ import annotations

import argparse
import sys
import time

from asp_npu.sim.preset import load_preset
from asp_npu.sim.run import build_workload, simulate

BASELINES = ("mindspeed-sync", "verl-sync", "one-step-off", "async-fifo", "sortedrl")


def _split(r) -> str:  # noqa: ANN001 - a ModeRun
    return str(r.layout.describe())


def _partial(r) -> str:  # noqa: ANN001 - a ModeRun or None
    if r is None:
        return "not run"
    return f"{_split(r)}, {r.metrics['throughput_tokens_per_s']:.0f}, {r.metrics['efficiency_hardware']:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--costs", default="3.4e-3,8.1e-4")
    ap.add_argument("--instances", default="1,2,4,8,16")
    ap.add_argument("--no-partial", action="store_true", help="skip the partial-rollout column")
    a = ap.parse_args(argv)
    try:
        costs = [float(x) for x in a.costs.split(",")]
        points = [int(x) for x in a.instances.split(",")]
    except ValueError:
        print("layout_sweep: --costs and --instances take comma-separated numbers", file=sys.stderr)
        return 2
    t0 = time.time()
    print("| cost | instances | devices | asp (auto) split | asp tokens/s | best baseline | asp vs it | "
          "x limit | x hardware | lag floor / hardware | "
          "asp auto + partial rollout: split, tokens/s, x hardware |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for cost in costs:
        base = {"cost.train_s_per_token": cost}
        preset = load_preset(a.preset, overrides={**base, "layout": "auto"})
        partial = load_preset(a.preset, overrides={**base, "layout": "auto", "rl.partial_rollout": True})
        workload = build_workload(preset)
        for k in points:
            asp = simulate(preset, workload, "asp", instances=k)
            runs = {m: simulate(preset, workload, m, instances=k) for m in BASELINES}
            best = max(runs, key=lambda m: runs[m].metrics["throughput_tokens_per_s"])
            pr = None if a.no_partial else simulate(partial, workload, "asp", instances=k)
            m, b = asp.metrics, runs[best].metrics
            tps, btps = m["throughput_tokens_per_s"], b["throughput_tokens_per_s"]
            lim = m["limit"]
            floor = lim["lag_floor_iteration_s"] / lim["hardware_iteration_s"]
            c = f"{cost:.1e}".replace("e-0", "e-")
            print(f"| {c} | {k} | {asp.layout.devices} | {_split(asp)} | {tps:.0f} | "
                  f"{btps:.0f} ({best}) | {100 * (tps / btps - 1):+.1f}% | {m['efficiency']:.3f} | "
                  f"{m['efficiency_hardware']:.3f} | "
                  f"{floor:.3f} | {_partial(pr)} |", flush=True)
    print(f"({time.time() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
