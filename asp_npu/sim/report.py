"""What `asp-npu bench sim` shows: per-mode tables, ratios against each baseline, the scaling sweep
and the bubble plot, all from the simulator's `ModeRun`s."""

from __future__ import annotations

from typing import Any

import numpy as np

from asp_npu.io import atomic_write_with
from asp_npu.sim.modes import BASELINES
from asp_npu.sim.run import ModeRun
from asp_npu.sim.workload import Workload


def trajectory_summary(w: Workload) -> dict[str, Any]:
    """The simulated trajectories of a multi-turn workload: turns, tokens, tool outputs and waits."""
    assert w.turns is not None
    c = w.turns.counts
    calls = w.turns.tool_s[w.turns.tool_s > 0]
    wait = w.tool_seconds.ravel()
    return {
        "turns_mean": round(float(c.mean()), 3),
        "turns_p50_p90_max": [int(np.percentile(c, 50)), int(np.percentile(c, 90)), int(c.max())],
        "one_turn_share": round(float(np.mean(c == 1)), 3),
        "model_tokens_mean": round(float(w.response_len.mean()), 1),
        "tool_tokens_mean": round(float(w.tool_len.mean()), 1),
        "tool_call_s_p50_p99_max": [round(float(np.percentile(calls, q)), 2) for q in (50, 99, 100)]
        if calls.size else [0.0, 0.0, 0.0],
        "tool_wait_s_per_trajectory_mean": round(float(wait.mean()), 2),
    }


def table(runs: dict[str, ModeRun]) -> str:
    head = (
        "| mode | layout | tokens/s | samples/s | iter mean s | p50 | p95 | util | padding | skewness | "
        "sorting | overhead | trainer idle | rollouter idle | lag mean/max | limit s | x limit | x hardware |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for m, r in runs.items():
        x, lay = r.metrics, r.layout
        where = (
            f"{lay.instances}x{lay.instance_devices} coloc"
            if x["layout"]["colocated"]
            else f"{lay.instances}x{lay.instance_devices}+{lay.trainer_devices}T"
        )
        b = x["bubbles"]
        lines.append(
            f"| {m} | {where} | {x['throughput_tokens_per_s']:.0f} | {x['samples_per_s']:.3f} | "
            f"{x['iteration_time_mean_s']:.1f} | {x['iteration_time_p50_s']:.1f} | "
            f"{x['iteration_time_p95_s']:.1f} | "
            f"{x['utilization']:.3f} | {b['padding']:.3f} | {b['skewness']:.3f} | {b['sorting']:.3f} | "
            f"{b['overhead']:.3f} | {x['trainer_idle_ratio']:.3f} | {x['rollouter_idle_ratio']:.3f} | "
            f"{x['lag_mean']:.2f}/{x['lag_max']} | {x['limit']['iteration_s']:.1f} | {x['efficiency']:.2f} | "
            f"{x['efficiency_hardware']:.2f} |"
        )
    return "\n".join(lines)


def ratios(runs: dict[str, ModeRun]) -> dict[str, dict[str, dict[str, float]]]:
    """mode -> baseline -> {throughput_x, iteration_time_change} (change < 0: faster)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for m, r in runs.items():
        out[m] = {}
        for b in BASELINES:
            if b == m or b not in runs:
                continue
            rb = runs[b].metrics
            out[m][b] = {
                "throughput_x": r.metrics["throughput_tokens_per_s"] / rb["throughput_tokens_per_s"],
                "iteration_time_change": r.metrics["iteration_time_mean_s"] / rb["iteration_time_mean_s"]
                - 1.0,
            }
    return out


def ratio_table(rat: dict[str, dict[str, dict[str, float]]], runs: dict[str, ModeRun]) -> str:
    bases = [b for b in BASELINES if b in runs]
    lines = ["| mode | " + " | ".join(f"vs {b}" for b in bases) + " |", "|---|" + "---|" * len(bases)]
    for m in runs:
        cells = []
        for b in bases:
            if b in rat[m]:
                c = rat[m][b]
                cells.append(f"{c['throughput_x']:.2f}x tput, {100 * c['iteration_time_change']:+.1f}% iter")
            else:
                cells.append("-")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def partial_table(runs: dict[str, ModeRun], modes: list[str]) -> str:
    """Partial rollout on vs off per mode: iteration time, throughput and the token-lag histogram."""
    lines = [
        "| mode | partial rollout | iter mean s | change | tokens/s | lag max (newest) | "
        "token lag mean/max | tokens by lag |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in modes:
        base = runs[m].metrics["iteration_time_mean_s"]
        for name, on in ((m, "off"), (f"{m}+partial", "on")):
            x = runs[name].metrics
            tl = x["token_lag"]
            total = sum(tl["hist"].values()) or 1
            shares = ", ".join(f"{k}: {100 * v / total:.1f}%" for k, v in tl["hist"].items())
            lines.append(
                f"| {m} | {on} | {x['iteration_time_mean_s']:.1f} | "
                f"{100 * (x['iteration_time_mean_s'] / base - 1):+.1f}% | "
                f"{x['throughput_tokens_per_s']:.0f} | "
                f"{x['lag_max']} | {tl['mean']:.2f}/{tl['max']} | {shares} |"
            )
    return "\n".join(lines)


def sweep_table(sweep: dict[int, dict[str, float]], modes: list[str]) -> str:
    lines = ["| instances | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for k, row in sweep.items():
        lines.append(f"| {k} | " + " | ".join(f"{row[m]:.0f}" for m in modes) + " |")
    return "\n".join(lines)


def plot(
    path: str,
    runs: dict[str, ModeRun],
    sweep: dict[int, dict[str, float]] | None,
    modes: list[str],
    title: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = 2 if sweep else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6.5 * ncols, 4.5), squeeze=False)
    ax = axes[0][0]
    names = list(runs)
    bottom = [0.0] * len(names)
    for key, color in (
        ("utilization", "tab:green"),
        ("padding", "tab:orange"),
        ("skewness", "tab:red"),
        ("sorting", "tab:purple"),
        ("overhead", "tab:gray"),
    ):
        vals = [
            runs[m].metrics["utilization"] if key == "utilization" else runs[m].metrics["bubbles"][key]
            for m in names
        ]
        ax.bar(names, vals, bottom=bottom, label=key, color=color)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("share of device-seconds")
    ax.set_title(f"{title}: utilisation + bubbles")
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=8)
    if sweep:
        ax2 = axes[0][1]
        ks = list(sweep)
        for m in modes:
            ax2.plot(ks, [sweep[k][m] for k in ks], marker="o", label=m)
        ax2.set_xscale("log", base=2)
        ax2.set_xlabel("rollout instances")
        ax2.set_ylabel("tokens/s")
        ax2.set_title("scaling with instances")
        ax2.legend(fontsize=8)
    fig.tight_layout()
    try:  # temp + fsync + rename: a failed write leaves neither a torn plot nor the temp file
        atomic_write_with(path, lambda f: fig.savefig(f, format="png", dpi=110))
    finally:
        plt.close(fig)
