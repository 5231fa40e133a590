"""The simulator's side of calibration: fit its decode cost model to an engine's measured points and
write the `asp-calib/1` file that presets read (`cost_from:`, `--calib`).

The measurement itself runs a real engine and lives with the rollout code
(asp_npu/pipeline/calibrate.py); this module is pure arithmetic on its points.
Schema `asp-calib/1`. The trainer fields (null when the trainer was not measured):
- `trainer_s_per_token`: device-seconds per sequence token of a trainer step placed as an
  asynchronous mode places it (wall seconds per token x ranks x threads per rank: the simulator
  divides by the trainer's devices), and `trainer_step_s`, the wall seconds every step costs on top
  whatever its tokens (optimizer update, launches; both from two minibatches of different answer
  lengths, asp_npu/trainer/calibrate.py); `trainer_s_per_token_colocated` / `trainer_step_s_colocated`:
  the same for a colocated mode's trainer (every core);
- `core_sharing`: `decode_slowdown` / `train_slowdown`, the medians of the paired ratios (shared over
  alone) measured in the run's placement; 1.0 where the placement keeps them apart and nothing
  interferes. The simulator applies each while the other side is busy (asp_npu/sim/contention.py).
  `colocated_decode_slowdown`: engine 0's decode step while every instance of a colocated mode
  decodes beside it on its own cores, over alone (the cores share caches and memory bandwidth);
  the simulator applies it to a colocated mode's rollout, where every instance always decodes at once.
"""

from __future__ import annotations

import statistics
from typing import Any

SCHEMA = "asp-calib/1"


def fit(points: dict[str, Any]) -> dict[str, Any]:
    """Least-squares cost fit; negative coefficients (noise) are dropped and the rest refitted."""
    import numpy as np

    d = points["decode"]
    y = np.array([p["step_s"] for p in d])
    cols = {
        "a": np.ones(len(d)),
        "b_per_seq": np.array([p["batch"] for p in d], float),
        "c_per_kv_token": np.array([p["kv_tokens"] for p in d], float),
    }
    keep = list(cols)
    coef: dict[str, float] = {}
    while keep:
        x = np.stack([cols[k] for k in keep], axis=1)
        sol, *_ = np.linalg.lstsq(x, y, rcond=None)
        coef = dict(zip(keep, sol.tolist(), strict=True))
        neg = [k for k in keep if coef[k] < 0 and k != "a"]
        if not neg:
            break
        keep.remove(min(neg, key=lambda k: coef[k]))
    step = {k: max(0.0, float(coef.get(k, 0.0))) for k in cols}
    pf = points["prefill"]
    prefill = None
    if len(pf) >= 2:
        xs = np.array([p["prompt_tokens"] for p in pf], float)
        slope = float(np.polyfit(xs, np.array([p["ttft_s"] for p in pf]), 1)[0])
        prefill = max(0.0, slope)
    refresh = statistics.median([r["total_s"] for r in points["refresh"]]) if points["refresh"] else None
    pred = (
        cols["a"] * step["a"]
        + cols["b_per_seq"] * step["b_per_seq"]
        + cols["c_per_kv_token"] * step["c_per_kv_token"]
    )
    rel_err = float(np.median(np.abs(pred - y) / y)) if len(y) else None
    return {
        "decode_step_s": step,
        "prefill_s_per_token": prefill,
        "refresh_s": refresh,
        "fit_median_rel_err": rel_err,
    }


def sharing(p: dict[str, Any]) -> dict[str, float]:
    """Slowdown factors: medians of the paired (shared / alone) ratios, never below 1 (noise)."""
    dec = [b / a for a, b in zip(p["decode_alone_s"], p["decode_shared_s"], strict=True) if a > 0]
    tr = [b / a for a, b in zip(p["train_alone_s"], p["train_shared_s"], strict=True) if a > 0]
    co = [b / a for a, b in zip(p.get("colocated_decode_alone_s", []), p.get("colocated_decode_shared_s", []),
                                strict=True) if a > 1e-5 and b > 1e-5]
    return {
        "decode_slowdown": max(1.0, statistics.median(dec)) if dec else 1.0,
        "train_slowdown": max(1.0, statistics.median(tr)) if tr else 1.0,
        "colocated_decode_slowdown": max(1.0, statistics.median(co)) if co else 1.0,
    }


def calibration(model: str, points: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The `asp-calib/1` document: the fitted costs, the raw points and how they were measured."""
    fitted = fit(points)
    tr = points.get("trainer")
    return {
        "schema": SCHEMA,
        "model": str(model),
        "decode_step_s": fitted["decode_step_s"],
        "prefill_s_per_token": fitted["prefill_s_per_token"],
        "refresh_s": fitted["refresh_s"],
        "trainer_s_per_token": tr["trainer"]["device_s_per_token"] if tr else None,
        "trainer_step_s": tr["trainer"].get("fixed_step_s") if tr else None,
        "trainer_s_per_token_colocated": tr["trainer_colocated"]["device_s_per_token"] if tr else None,
        "trainer_step_s_colocated": tr["trainer_colocated"].get("fixed_step_s") if tr else None,
        "core_sharing": sharing(tr["sharing"]) if tr else None,
        "points": points,
        "meta": {**meta, "fit_median_rel_err": fitted["fit_median_rel_err"]},
    }
