"""The simulator's side of calibration: fit its decode cost model to an engine's measured points and
write the `asp-calib/1` file that presets read (`cost_from:`, `--calib`).

The measurement itself runs a real engine and lives with the rollout code
(asp_npu/pipeline/calibrate.py); this module is pure arithmetic on its points.
Schema `asp-calib/1`. `matmul_flops_per_s`: the median of a timed fp32 torch matmul per device (one
thread = one core on CPU; the denominator of a run's MFU), probed at the calibration's start, middle and
end, so its spread is the machine's own drift (`SPEED`). `host_optimizer_s_per_param`: the median
seconds per parameter of the host-side Adam step under `optimizer_cpu_offload` (fp32 master, gradient
and two moments, one thread: a trainer rank's share; `asp-npu check --calib` and
`trainer.host_optimizer_s_per_param` charge it per offloaded parameter). `spread`: every figure's
median, min, max and relative spread over the repeats; `trust`: whether they agree within 5% and other
processes left the machine alone during the probes (`verdict`), with the one line `asp-npu calibrate` prints.
The decode fit is judged by the step time it predicts at the probe's two corners (the smallest batch at
its least KV, the largest at its most: `decode_step_at_batch_<n>`), not by its coefficients: KV tokens
grow with the batch, so `b_per_seq` and `c_per_kv_token` trade off from one repeat to the next while the
step times the simulator takes from them hardly move (their spreads are still reported).
The trainer fields (null when the trainer was not measured):
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
MAX_SPREAD = 0.05  # a figure whose repeats differ by more than this (max - min over median) is noise
MAX_FOREIGN_LOAD = 0.10  # mean CPU use of other processes during the probes, as a share of the cores


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


def calibration(model: str, points: dict[str, Any], meta: dict[str, Any], max_spread: float = MAX_SPREAD,
                max_foreign: float = MAX_FOREIGN_LOAD) -> dict[str, Any]:
    """The `asp-calib/1` document: the fitted costs, the raw points and how they were measured, each
    figure's spread over the repeats and whether the machine was quiet enough to trust them."""
    fitted = fit(points)
    tr = points.get("trainer")
    spreads = figure_spreads(points)
    load = meta.get("foreign_load") or {}
    mm = points.get("matmul_flops_per_s")
    host = points.get("host_optimizer_s_per_param")
    return {
        "matmul_flops_per_s": float(statistics.median(mm)) if mm else None,
        "host_optimizer_s_per_param": float(statistics.median(host)) if host else None,
        "spread": spreads,
        "trust": verdict(spreads, load.get("mean"), load.get("loadavg_1m_max"), max_spread, max_foreign),
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


def fit_step(long_s: list[float], long_tokens: int, short_s: list[float],
             short_tokens: int) -> tuple[float, float]:
    """(fixed seconds per step, seconds per token) through the medians of two batch sizes; a slope
    the noise made negative or a negative intercept falls back to proportional (fixed 0)."""
    a, b = statistics.median(long_s), statistics.median(short_s)
    if long_tokens <= short_tokens:
        return 0.0, a / long_tokens
    slope = (a - b) / (long_tokens - short_tokens)
    fixed = a - slope * long_tokens
    if slope <= 0 or fixed < 0:
        return 0.0, a / long_tokens
    return fixed, slope


# -- how far a calibration can be trusted: each figure's spread over the repeats, the machine's load ---



def spread(xs: list[float]) -> dict[str, float]:
    """Median, min, max and relative spread `(max - min) / median` of one figure's repeats (0 for a
    single repeat or an all-zero figure; inf when the median is 0 but not every repeat is)."""
    med = float(statistics.median(xs)) if xs else 0.0
    lo, hi = (float(min(xs)), float(max(xs))) if xs else (0.0, 0.0)
    rel = (hi - lo) / abs(med) if med else (0.0 if hi == lo else float("inf"))
    return {"median": med, "min": lo, "max": hi, "rel": rel, "n": len(xs)}


def _runs(items: list[dict[str, Any]], key: str, fallback: str) -> list[list[float]]:
    return [list(p.get(key) or [p[fallback]]) for p in items]


def fit_per_repeat(points: dict[str, Any]) -> list[dict[str, Any]]:
    """One cost fit per repeat index (repeat k's decode and prefill points), where every point kept its
    repeats (`step_s_runs`, `ttft_s_runs`)."""
    dec = _runs(points["decode"], "step_s_runs", "step_s")
    pre = _runs(points["prefill"], "ttft_s_runs", "ttft_s")
    n = min((len(r) for r in dec + pre), default=0)
    out = []
    for k in range(n if n > 1 else 0):
        pts = {"decode": [{**p, "step_s": r[k]} for p, r in zip(points["decode"], dec, strict=True)],
               "prefill": [{**p, "ttft_s": r[k]} for p, r in zip(points["prefill"], pre, strict=True)],
               "refresh": []}
        out.append(fit(pts))
    return out


NOT_JUDGED = ("decode_a", "decode_b_per_seq", "decode_c_per_kv_token")  # judged at the corners instead
SPEED = "matmul_flops_per_s"  # probed over the whole calibration: its spread is the machine's own drift


def decode_corners(decode: list[dict[str, Any]]) -> dict[str, tuple[int, float]]:
    """(batch, KV tokens) of the smallest measured batch at its least KV and the largest at its most."""
    small, large = min(p["batch"] for p in decode), max(p["batch"] for p in decode)
    kv_small = min(p["kv_tokens"] for p in decode if p["batch"] == small)
    kv_large = max(p["kv_tokens"] for p in decode if p["batch"] == large)
    return {f"decode_step_at_batch_{small}": (small, kv_small),
            f"decode_step_at_batch_{large}": (large, kv_large)}


def step_s(decode_step_s: dict[str, float], batch: float, kv_tokens: float) -> float:
    """The decode step a calibration's fit (`decode_step_s`) predicts, as the planner's cost model does."""
    from asp_npu.schedule.cost import CostModel

    d = decode_step_s
    return CostModel(d["a"], d["b_per_seq"], d["c_per_kv_token"]).step_seconds(batch, kv_tokens)


def figure_spreads(points: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Every calibrated figure's spread over its repeats: the decode fit (its coefficients and the step
    time at the probe's corners) and the prefill slope (one fit per repeat), weight refresh, the trainer
    steps (both placements), the core-sharing ratios and the matmul and host-optimizer probes."""
    out: dict[str, dict[str, float]] = {}
    fits = fit_per_repeat(points)
    if fits:
        for k in ("a", "b_per_seq", "c_per_kv_token"):
            out[f"decode_{k}"] = spread([f["decode_step_s"][k] for f in fits])
        for name, (batch, kv) in decode_corners(points["decode"]).items():
            out[name] = spread([step_s(f["decode_step_s"], batch, kv) for f in fits])
        pf = [f["prefill_s_per_token"] for f in fits if f["prefill_s_per_token"] is not None]
        if pf:
            out["prefill_s_per_token"] = spread(pf)
    if points.get("refresh"):
        out["refresh_s"] = spread([r["total_s"] for r in points["refresh"]])
    tr = points.get("trainer")
    if tr:
        for name, key in (("trainer_s_per_token", "trainer"),
                          ("trainer_s_per_token_colocated", "trainer_colocated")):
            t = tr.get(key) or {}
            if "step_s" not in t:  # given as a fitted figure only: no repeats to spread
                continue
            scale = t.get("world", 1) * t.get("threads", 1)
            per = [fit_step([a], tr["batch_tokens"], [b], tr["short_batch_tokens"])[1] * scale
                   for a, b in zip(t["step_s"], t["short_step_s"], strict=False)]
            out[name] = spread(per)
        sh = tr["sharing"]
        for name, (alone, shared) in {"decode_slowdown": ("decode_alone_s", "decode_shared_s"),
                                      "train_slowdown": ("train_alone_s", "train_shared_s")}.items():
            ratios = [b / a for a, b in zip(sh[alone], sh[shared], strict=True) if a > 0]
            if ratios:
                out[name] = spread(ratios)
    for key in ("matmul_flops_per_s", "host_optimizer_s_per_param"):
        if points.get(key):
            out[key] = spread(list(points[key]))
    return out


def verdict(spreads: dict[str, dict[str, float]], foreign_load: float | None, loadavg: float | None = None,
            max_spread: float = MAX_SPREAD, max_foreign: float = MAX_FOREIGN_LOAD) -> dict[str, Any]:
    """Whether the calibration can be trusted, and the one line that says so (or why not): every
    figure's repeats within `max_spread` (the decode fit at its corners, when they were measured, not
    its coefficients), and other processes' mean CPU use during the probes (a share of the cores) at
    most `max_foreign`."""
    corners = any(k.startswith("decode_step_at_batch_") for k in spreads)
    judged = {k: s for k, s in spreads.items() if not (corners and k in NOT_JUDGED) and k != SPEED}
    wide = sorted(((s["rel"], k) for k, s in judged.items() if s["rel"] > max_spread and s["n"] > 1),
                  reverse=True)
    busy = foreign_load is not None and foreign_load > max_foreign
    why = [f"{len(wide)} figure(s) spread over {max_spread:.0%}, widest {wide[0][1]} {wide[0][0]:.0%}"
           ] if wide else []
    speed = spreads.get(SPEED, {"rel": 0.0, "n": 0})
    if speed["n"] > 1 and speed["rel"] > max_spread:
        why.append(f"the machine's own speed moved {speed['rel']:.0%} (one core's matmul, probed at the "
                   f"start, middle and end: other tenants of a shared host)")
    if busy:
        why.append(f"other processes used {foreign_load:.0%} of the cores during the probes "
                   f"(threshold {max_foreign:.0%})")
    load = f", load average {loadavg:.1f}" if loadavg is not None else ""
    reps = max((s["n"] for s in spreads.values()), default=0)
    if why:
        line = f"calibration NOT trusted, the machine was too noisy: {'; '.join(why)}{load}"
    else:
        fl = f"{foreign_load:.0%}" if foreign_load is not None else "unmeasured"
        line = (f"calibration trusted: every figure within {max_spread:.0%} over {reps} repeats, "
                f"foreign load {fl} of the cores{load}")
    return {"trusted": not why, "line": line, "max_spread": max_spread, "max_foreign_load": max_foreign,
            "foreign_load": foreign_load, "loadavg_1m": loadavg,
            "widest": [{"figure": k, "rel": r} for r, k in wide]}
