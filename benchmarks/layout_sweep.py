"""Issue #26's sweep: the `paper` preset at 1-16 instances (equal device count per point), ASP with
`layout: auto` against every baseline, at the preset's trainer cost and at both ends of the band
8.1e-4 .. 3.4e-3 s/token; prints tokens/s, x limit and x hardware per mode and point (deterministic).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/layout_sweep.py
"""

from __future__ import annotations

import time

from asp_npu.sim.preset import load_preset
from asp_npu.sim.run import build_workload, simulate

MODES = ("mindspeed-sync", "verl-sync", "one-step-off", "async-fifo", "sortedrl", "asp")


def main() -> None:
    t0 = time.time()
    for cost in (None, 8.1e-4, 3.4e-3):
        overrides: dict[str, object] = {"layout": "auto"}
        if cost is not None:
            overrides["cost.train_s_per_token"] = cost
        preset = load_preset("paper", overrides=overrides)
        workload = build_workload(preset)
        for k in (1, 2, 4, 8, 16):
            row = {}
            for mode in MODES:
                r = simulate(preset, workload, mode, instances=k)
                m = r.metrics
                row[mode] = (round(m["throughput_tokens_per_s"]), round(m.get("efficiency", 0), 3),
                             round(m.get("efficiency_hardware", 0), 3), str(r.layout))
            print(cost, k, row, round(time.time() - t0), flush=True)


if __name__ == "__main__":
    main()
