"""Plan quality of ASP vs FIFO vs random dispatch, measured on the *actual* lengths of the planned epoch.

Usage: .venv/bin/python benchmarks/plan_quality.py [--seeds 3] [--instances 8] [--json]

Traces: our generator's defaults, with drift, and two shapes NOT from its defaults, built here:
bimodal prompt populations (short and long problems) and a heavier tail (Pareto-like per-sample
noise, 32K cap). Each cell is the median over `--seeds` trace seeds. Plans use history predictions
(epochs < planned epoch) unless stated; the oracle row shows what perfect per-prompt statistics buy.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asp_npu.data.traces import SynthParams, Trace, group_table, synth_trace  # noqa: E402
from asp_npu.predict.groups import groups_for_epoch  # noqa: E402
from asp_npu.schedule.baselines import fifo_plan, random_plan  # noqa: E402
from asp_npu.schedule.planner import PlannerConfig, plan  # noqa: E402
from asp_npu.schedule.quality import plan_quality  # noqa: E402


def bimodal_trace(prompts: int, epochs: int, n: int, seed: int) -> Trace:
    """Two prompt populations (e.g. arithmetic vs olympiad): medians 600 and 6000 tokens, 16K cap."""
    rng = np.random.default_rng(seed)
    long_ = rng.random(prompts) < 0.35
    centre = np.where(long_, np.log(6000), np.log(600)) + rng.normal(0, 0.3, prompts)
    wob = rng.normal(0, 0.2, (epochs, prompts))
    logl = centre[None, :, None] + wob[:, :, None] + rng.normal(0, 0.45, (epochs, prompts, n))
    return _to_trace(np.clip(np.rint(np.exp(logl)), 8, 16384), rng)


def heavy_tail_trace(prompts: int, epochs: int, n: int, seed: int) -> Trace:
    """Per-sample Pareto(alpha=1.5) multiplier on a lognormal prompt centre: p99/median >> 10, 32K cap."""
    rng = np.random.default_rng(seed)
    centre = np.log(1500) + rng.normal(0, 1.0, prompts)
    wob = rng.normal(0, 0.35, (epochs, prompts))
    pareto = rng.pareto(1.5, (epochs, prompts, n)) + 0.5
    logl = centre[None, :, None] + wob[:, :, None] + np.log(pareto)
    return _to_trace(np.clip(np.rint(np.exp(logl)), 8, 32768), rng)


def _to_trace(lens: np.ndarray, rng: np.random.Generator) -> Trace:
    E, P, n = lens.shape
    ep, pr, sm = np.meshgrid(np.arange(E), np.arange(P), np.arange(n), indexing="ij")
    plen = rng.integers(50, 400, P)
    return Trace(
        np.array([f"q{i:06d}" for i in range(P)]),
        pr.ravel(),
        ep.ravel(),
        sm.ravel(),
        plen[pr.ravel()],
        lens.ravel().astype(np.int64),
    )


def traces(seed: int, prompts: int) -> dict[str, Trace]:
    return {
        "synth-default": synth_trace(SynthParams(prompts=prompts, epochs=4, n=16, seed=seed)),
        "synth-drift0.1": synth_trace(SynthParams(prompts=prompts, epochs=4, n=16, seed=seed, drift=0.1)),
        "bimodal": bimodal_trace(prompts, 4, 16, seed),
        "heavy-tail": heavy_tail_trace(prompts, 4, 16, seed),
    }


def actual_lengths(trace: Trace, epoch: int, result) -> np.ndarray:
    cur = trace.epoch_rows(epoch)
    _, rows, n = group_table(cur)
    mat = cur.response_len[rows]
    return mat[result.sample_group, np.arange(result.num_samples) % n].astype(np.float64)


def run(
    seeds: int, instances: int, minibatch: int, max_lag: int, prompts: int, paces: list[str]
) -> list[dict]:
    """`paces`: "0" = instant trainer; "matched" = trainer seconds per step equal to the ASP plan's
    predicted rollout seconds per minibatch (trainer and rollout equally fast: where sorting matters)."""
    rows = []
    for s in range(seeds):
        for name, tr in traces(1000 + s, prompts).items():
            epoch = 3
            for predictor in ("history", "oracle"):
                groups = groups_for_epoch(tr, epoch, predictor)
                for pace in paces:
                    cfg = PlannerConfig(
                        num_instances=instances,
                        minibatch=minibatch,
                        group_size=groups.group_size,
                        max_num_seqs=256,
                        max_lag=max_lag,
                        seed=s,
                    )
                    if pace == "matched":
                        probe = plan(groups, cfg).summary
                        cfg = replace(cfg, train_step_s=probe["lower_bound"] / probe["trainer_steps"])
                    fns = {"asp": plan}
                    if predictor == "history":
                        fns |= {"fifo": fifo_plan, "random": random_plan}
                    for dispatch, fn in fns.items():
                        result = fn(groups, cfg)
                        q = plan_quality(result, actual_lengths(tr, epoch, result), cfg)
                        rows.append(
                            {
                                "trace": name,
                                "predictor": predictor,
                                "pace": pace,
                                "dispatch": dispatch,
                                "seed": s,
                                "ordering": result.summary.get("ordering", "-"),
                                **q,
                            }
                        )
    return rows


def within_group_spread(seeds: int, prompts: int) -> dict[str, float]:
    """Mean (max - mean)/max inside one GRPO group of the planned epoch: the padding a unit of whole
    groups cannot go below, whatever the predictor (samples of one prompt differ in length)."""
    out: dict[str, list[float]] = {}
    for s in range(seeds):
        for name, tr in traces(1000 + s, prompts).items():
            cur = tr.epoch_rows(3)
            _, rows, _ = group_table(cur)
            mat = cur.response_len[rows].astype(np.float64)
            out.setdefault(name, []).append(float(np.mean((mat.max(1) - mat.mean(1)) / mat.max(1))))
    return {k: round(float(np.median(v)), 4) for k, v in out.items()}


def medians(rows: list[dict]) -> list[dict]:
    keys = sorted(
        {(r["trace"], r["pace"], r["predictor"], r["dispatch"]) for r in rows},
        key=lambda k: (k[0], k[1], k[2] != "history", ["asp", "fifo", "random"].index(k[3])),
    )
    out = []
    for k in keys:
        sel = [r for r in rows if (r["trace"], r["pace"], r["predictor"], r["dispatch"]) == k]
        med = {
            m: round(float(np.median([r[m] for r in sel])), 4) for m in sel[0] if isinstance(sel[0][m], float)
        }
        orderings = sorted({r["ordering"] for r in sel})
        out.append(
            {
                "trace": k[0],
                "pace": k[1],
                "predictor": k[2],
                "dispatch": k[3],
                "n": len(sel),
                "ordering": "/".join(orderings),
                **med,
            }
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--minibatch", type=int, default=1024)
    ap.add_argument("--max-lag", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=4000)
    ap.add_argument("--paces", default="0,matched", help="trainer pace: 0 (instant) and/or matched")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    table = medians(run(a.seeds, a.instances, a.minibatch, a.max_lag, a.prompts, a.paces.split(",")))
    floor = within_group_spread(a.seeds, a.prompts)
    if a.json:
        print(json.dumps({"table": table, "within_group_spread": floor}, indent=1))
        return 0
    cols = [
        "token_load_max_over_mean",
        "intra_unit_spread_mean",
        "work_seconds",
        "realised_makespan",
        "realised_ratio",
        "realised_trainer_end",
    ]
    print(
        f"K={a.instances} M={a.minibatch} max_lag={a.max_lag} prompts={a.prompts}x16 epoch 3, "
        f"median of {a.seeds} trace seeds"
    )
    print("| trace | trainer pace | predictor | dispatch (ordering) | " + " | ".join(cols) + " |")
    print("|" + "---|" * (4 + len(cols)))
    for r in table:
        head = f"| {r['trace']} | {r['pace']} | {r['predictor']} | {r['dispatch']} ({r['ordering']}) | "
        print(head + " | ".join(str(r[c]) for c in cols) + " |")
    print()
    print(
        "within-group spread (floor for units of whole groups): "
        + ", ".join(f"{k} {v}" for k, v in floor.items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
