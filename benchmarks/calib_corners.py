"""How far apart a calibration's repeats are in what the simulator uses: the decode step time
(`schedule.cost.CostModel.step_seconds`) at the probe's corner points, next to the spread of the
coefficients themselves.

KV tokens grow with the batch, so the fitted `b` and `c` trade off against each other from one repeat
to the next; the step time they predict at the measured points is the better-conditioned figure.
Reads a calibration file (`asp-npu calibrate --out`), fits each repeat's decode points as `calibrate`
does (`sim.calibrate.fit_per_repeat`) and prints, per corner, each repeat's step time and the spread.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/calib_corners.py CALIB.json [CALIB2.json ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from asp_npu.schedule.cost import CostModel
from asp_npu.sim.calibrate import fit_per_repeat, spread


def corners(decode: list[dict]) -> dict[str, tuple[int, float]]:
    """(batch, KV tokens) of the smallest batch at its least KV and the largest batch at its most KV."""
    small, large = min(p["batch"] for p in decode), max(p["batch"] for p in decode)
    kv_small = min(p["kv_tokens"] for p in decode if p["batch"] == small)
    kv_large = max(p["kv_tokens"] for p in decode if p["batch"] == large)
    return {f"batch {small}, least KV": (small, kv_small), f"batch {large}, most KV": (large, kv_large)}


def report(path: str) -> None:
    points = json.loads(Path(path).read_text())["points"]
    fits = [f["decode_step_s"] for f in fit_per_repeat(points)]
    models = [CostModel(f["a"], f["b_per_seq"], f["c_per_kv_token"]) for f in fits]
    if not fits:
        print(f"{path}: fewer than 2 repeats, no spread")
        return
    print(f"{path} ({len(fits)} repeats)")
    for name, (batch, kv) in corners(points["decode"]).items():
        steps = [m.step_seconds(batch, kv) for m in models]
        s = spread(steps)
        runs = ", ".join(f"{x * 1e3:.3f}" for x in steps)
        print(f"  step at {name:<22} {s['median'] * 1e3:8.3f} ms  spread {s['rel']:6.1%}  ({runs} ms)")
    for key in ("a", "b_per_seq", "c_per_kv_token"):
        print(f"  coefficient {key:<16} spread {spread([f[key] for f in fits])['rel']:6.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("calibrations", nargs="+", help="calibration JSON files (asp-calib/1)")
    for path in parser.parse_args().calibrations:
        report(path)


if __name__ == "__main__":
    main()
