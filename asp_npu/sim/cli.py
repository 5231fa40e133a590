"""`asp-npu bench sim`: every mode on one preset, side by side, with ratios against each baseline.

asp-npu bench sim --preset paper [--trace FILE] [--iterations N] [--modes asp,async-fifo]
                  [--instances 1,2,4,8,16] [--json out.json] [--plot out.png] [--timeline out.json]
"""

from __future__ import annotations

import sys
import time
from typing import Any

from asp_npu.cli import command_parser
from asp_npu.errors import UserError
from asp_npu.io import atomic_write_json, check_writable
from asp_npu.observe.timeline import write_timeline
from asp_npu.sim.modes import BASELINES, MODES
from asp_npu.sim.preset import load_preset
from asp_npu.sim.run import ModeRun, build_workload, run_modes


def _int_list(text: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{what}: expected comma-separated integers, got '{text}'") from None
    if not vals or min(vals) < 1:
        raise UserError(f"{what}: expected integers >= 1, got '{text}'")
    return vals


def _modes(text: str | None) -> list[str]:
    if not text:
        return list(MODES)
    out = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in out if m not in MODES]
    if bad:
        raise UserError(f"--modes: unknown mode '{bad[0]}' (modes: {', '.join(MODES)})")
    return out


def table(runs: dict[str, ModeRun]) -> str:
    head = (
        "| mode | layout | tokens/s | samples/s | iter mean s | p50 | p95 | util | padding | skewness | "
        "sorting | overhead | trainer idle | rollouter idle | lag mean/max |"
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
            f"{x['lag_mean']:.2f}/{x['lag_max']} |"
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
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    ap = command_parser("bench sim", "simulate all modes (ASP and baselines) at cluster scale")
    ap.add_argument("--preset", required=True, help="preset name (configs/sim/NAME.yaml) or a YAML path")
    ap.add_argument("--trace", help="JSONL length trace (overrides the preset's workload)")
    ap.add_argument(
        "--calib", help="asp-calib/1 file from `asp-npu calibrate` (overrides the preset's cost_from)"
    )
    ap.add_argument("--iterations", type=int, help="iterations to simulate (overrides the preset)")
    ap.add_argument(
        "--executor", choices=("stream", "unit"), help="how asp / async-fifo run units (preset default)"
    )
    ap.add_argument("--max-lag", type=int, help="policy-lag bound of the asynchronous modes (preset default)")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a preset value, e.g. cost.train_s_per_token=8.1e-4 (repeatable)",
    )
    ap.add_argument("--modes", help=f"comma-separated subset of {','.join(MODES)}")
    ap.add_argument("--instances", help="scaling sweep: comma-separated instance counts, e.g. 1,2,4,8,16")
    ap.add_argument("--json", help="write all metrics as JSON")
    ap.add_argument("--plot", help="write a PNG (bubbles per mode; scaling sweep if --instances)")
    ap.add_argument("--timeline", help="write a Perfetto trace of one simulated iteration")
    ap.add_argument(
        "--timeline-mode", default="asp", help="mode whose iteration --timeline shows (default asp)"
    )
    args = ap.parse_args(argv)
    if args.iterations is not None and args.iterations < 1:
        raise UserError(f"--iterations must be >= 1 (got {args.iterations})")
    modes = _modes(args.modes)
    counts = _int_list(args.instances, "--instances") if args.instances else []
    if args.timeline and args.timeline_mode not in modes:
        raise UserError(f"--timeline-mode '{args.timeline_mode}' is not among the simulated modes")
    for path in (args.json, args.plot, args.timeline):
        if path:
            check_writable(path)
    overrides: dict[str, Any] = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UserError(f"--set {item}: expected SECTION.KEY=VALUE")
        import yaml

        try:
            overrides[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise UserError(f"--set {item}: cannot parse the value") from None
    if args.executor:
        overrides["executor"] = args.executor
    if args.max_lag is not None:
        if args.max_lag < 0:
            raise UserError(f"--max-lag must be >= 0 (got {args.max_lag})")
        overrides["max_lag"] = args.max_lag
    preset = load_preset(
        args.preset, iterations=args.iterations, trace=args.trace, calib=args.calib, overrides=overrides
    )
    workload = build_workload(preset)
    t0 = time.perf_counter()
    runs = run_modes(preset, workload, modes)
    rat = ratios(runs)
    print(
        f"## asp-npu bench sim --preset {preset.name}: {workload.num_iterations} iterations x "
        f"{workload.prompts_per_iteration} prompts x {workload.group_size} samples, "
        f"{preset.cluster.devices} devices"
    )
    for note in preset.notes:
        print(f"note: {note}")
    print()
    print(table(runs))
    print()
    print(ratio_table(rat, runs))
    sweep: dict[int, dict[str, float]] = {}
    if counts:
        for k in counts:
            sw = run_modes(preset, workload, modes, instances=k)
            sweep[k] = {m: r.metrics["throughput_tokens_per_s"] for m, r in sw.items()}
        print()
        print(
            f"scaling sweep (tokens/s; disaggregated: K instances + {preset.cluster.sweep_trainer_devices} "
            f"trainer devices; colocated: the same device count)"
        )
        print()
        print(sweep_table(sweep, modes))
    print(f"\nsimulated in {time.perf_counter() - t0:.1f} s")
    if args.json:
        doc: dict[str, Any] = {
            "preset": preset.describe(),
            "workload": {
                "iterations": workload.num_iterations,
                "prompts_per_iteration": workload.prompts_per_iteration,
                "group_size": workload.group_size,
                "source": workload.source,
                "response_tokens": workload.total_response_tokens,
            },
            "modes": {m: r.metrics for m, r in runs.items()},
            "ratios": rat,
        }
        if sweep:
            doc["sweep"] = {str(k): v for k, v in sweep.items()}
        atomic_write_json(args.json, doc, indent=1)
    if args.plot:
        plot(args.plot, runs, sweep or None, modes, preset.name)
    if args.timeline:
        r = runs[args.timeline_mode]
        ends = r.result.iteration_ends
        k = len(ends) // 2
        a = ends[k - 1] if k > 0 else 0.0
        write_timeline(args.timeline, r.result.log, a, ends[k])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
