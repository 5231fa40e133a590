"""How far apart a calibration's repeats are, and how far apart several calibrations are, in what the
simulator uses: the decode step time (`sim.calibrate.step_s`) at the probe's corner points
(`sim.calibrate.decode_corners`), next to the spread of the coefficients themselves, and every other
calibrated figure.

KV tokens grow with the batch, so the fitted `b` and `c` trade off against each other from one repeat
to the next; the step time they predict at the measured points is the better-conditioned figure.
Reads calibration files (`asp-npu calibrate --out`), fits each repeat's decode points as `calibrate`
does (`sim.calibrate.fit_per_repeat`) and prints, per corner, each repeat's step time and the spread.
Given two or more files, it then prints each figure as each calibration gives it and the spread
across the calibrations (`(max - min) / median`, as for the repeats), marking those over 5%.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/calib_corners.py CALIB.json [CALIB2.json ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from asp_npu.sim.calibrate import MAX_SPREAD, decode_corners, fit_per_repeat, spread, step_s


def report(path: str) -> None:
    points = json.loads(Path(path).read_text())["points"]
    fits = [f["decode_step_s"] for f in fit_per_repeat(points)]
    if not fits:
        print(f"{path}: fewer than 2 repeats, no spread")
        return
    print(f"{path} ({len(fits)} repeats)")
    for batch, kv in decode_corners(points["decode"]).values():
        steps = [step_s(f, batch, kv) for f in fits]
        s = spread(steps)
        runs = ", ".join(f"{x * 1e3:.3f}" for x in steps)
        name = f"batch {batch}, {kv:.0f} KV"
        print(f"  step at {name:<22} {s['median'] * 1e3:8.3f} ms  spread {s['rel']:6.1%}  ({runs} ms)")
    for key in ("a", "b_per_seq", "c_per_kv_token"):
        print(f"  coefficient {key:<16} spread {spread([f[key] for f in fits])['rel']:6.1%}")


def figures(calib: dict) -> dict[str, float]:
    """The figures the simulator takes from one calibration, the decode fit also at its corners."""
    d = calib["decode_step_s"]
    out = {f"decode {k}": d[k] for k in ("a", "b_per_seq", "c_per_kv_token")}
    for batch, kv in decode_corners(calib["points"]["decode"]).values():
        out[f"decode step at batch {batch}"] = step_s(d, batch, kv)
    for key in ("prefill_s_per_token", "refresh_s", "trainer_s_per_token", "trainer_s_per_token_colocated",
                "matmul_flops_per_s", "host_optimizer_s_per_param"):
        if calib.get(key):
            out[key] = calib[key]
    for key, value in (calib.get("core_sharing") or {}).items():
        out[f"core sharing {key}"] = value
    return out


def across(paths: list[str]) -> None:
    per = [figures(json.loads(Path(p).read_text())) for p in paths]
    names = [k for k in per[0] if all(k in f for f in per)]
    wide = 0
    print(f"\nacross {len(paths)} calibrations ({', '.join(Path(p).name for p in paths)})")
    for k in names:
        s = spread([f[k] for f in per])
        wide += s["rel"] > MAX_SPREAD
        values = ", ".join(f"{f[k]:.4g}" for f in per)
        print(f"  {k:<42} spread {s['rel']:6.1%}{' *' if s['rel'] > MAX_SPREAD else '  '}  ({values})")
    print(f"  {len(names) - wide} of {len(names)} figures agree within {MAX_SPREAD:.0%} (* = over)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("calibrations", nargs="+", help="calibration JSON files (asp-calib/1)")
    paths = parser.parse_args().calibrations
    for path in paths:
        report(path)
    if len(paths) > 1:
        across(paths)


if __name__ == "__main__":
    main()
