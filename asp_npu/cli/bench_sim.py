"""`asp-npu bench sim`: every mode on one preset, side by side, with ratios against each baseline.

Multi-turn tool-calling trajectories: a preset whose `workload.multi_turn` sets the trajectory
generator (`--preset agentic`, `--preset agentic-bimodal`, or `--set workload.multi_turn={...}`).

asp-npu bench sim --preset paper [--trace FILE] [--iterations N] [--modes asp,async-fifo]
                  [--partial-rollout] [--instances 1,2,4,8,16] [--json out.json] [--plot out.png]
                  [--timeline out.json]
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from asp_npu.cli import command_parser
from asp_npu.errors import UserError
from asp_npu.io import atomic_write_json
from asp_npu.observe.timeline import write_timeline
from asp_npu.outputs import check_output, distinct_outputs
from asp_npu.sim.modes import MODES, partial_allowed
from asp_npu.sim.preset import load_preset
from asp_npu.sim.report import (
    partial_table,
    plot,
    ratio_table,
    ratios,
    sweep_table,
    table,
    trajectory_summary,
)
from asp_npu.sim.run import build_workload, run_modes, simulate


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


def _parser() -> Any:
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
    ap.add_argument(
        "--partial-rollout",
        action="store_true",
        help="run each selected asynchronous disaggregated mode with partial rollout off and on "
        "(the runs with it on are named <mode>+partial)",
    )
    ap.add_argument("--instances", help="scaling sweep: comma-separated instance counts, e.g. 1,2,4,8,16")
    ap.add_argument("--json", help="write all metrics as JSON")
    ap.add_argument("--plot", help="write a PNG (bubbles per mode; scaling sweep if --instances)")
    ap.add_argument("--timeline", help="write a Perfetto trace of one simulated iteration")
    ap.add_argument(
        "--timeline-mode", default="asp", help="mode whose iteration --timeline shows (default asp)"
    )
    return ap


def _overrides(args: Any) -> dict[str, Any]:
    """Preset overrides from `--set`, `--executor` and `--max-lag`."""
    import yaml

    overrides: dict[str, Any] = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UserError(f"--set {item}: expected SECTION.KEY=VALUE")
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
    return overrides


def _simulate_all(preset: Any, workload: Any, modes: list[str], partial: list[str] | None) -> dict[str, Any]:
    """Every mode; with `partial` (the `--partial-rollout` modes) each mode off, then on, side by side."""
    if partial is None:
        return run_modes(preset, workload, modes)
    off = replace(preset, rl=replace(preset.rl, partial_rollout=False))
    on = replace(preset, rl=replace(preset.rl, partial_rollout=True))
    runs = {}
    for m in modes:
        runs[m] = simulate(off, workload, m)
        if m in partial:
            runs[f"{m}+partial"] = simulate(on, workload, m)
    return runs


def _sweep(preset: Any, workload: Any, modes: list[str], counts: list[int]) -> dict[int, dict[str, float]]:
    """Throughput of every mode at each instance count (the scaling sweep)."""
    sweep: dict[int, dict[str, float]] = {}
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
    return sweep


def _write_json(path: str, preset: Any, workload: Any, runs: dict[str, Any], rat: Any,
                sweep: dict[int, dict[str, float]]) -> None:
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
    if workload.multi_turn:
        doc["workload"]["multi_turn"] = trajectory_summary(workload)
    if sweep:
        doc["sweep"] = {str(k): v for k, v in sweep.items()}
    atomic_write_json(path, doc, indent=1)


MAX_SAMPLE_RUNS = 1_000_000  # simulated samples held at once, summed over the runs kept (docs/limits.md)
MAX_SWEEP_COUNTS = 16  # --instances values (each one simulates every mode again)
BYTES_PER_SAMPLE = 1_200  # measured: tiny, asp, 200 vs 2,000 iterations grow 1.07 KB per sample


def _check_size(preset: Any, runs: int) -> None:
    """Refuse, before allocating, a simulation over the documented limit or the free memory: the
    `runs` simulated runs kept at once each hold their per-sample log until the tables are printed."""
    w = preset.workload
    samples = w.iterations * w.prompts_per_iteration * w.n_samples_per_prompt
    total = samples * runs
    if total > MAX_SAMPLE_RUNS:
        raise UserError(f"--iterations {w.iterations}: {samples:,} samples x {runs} simulated run(s) = "
                        f"{total:,}, "
                        f"over the limit of {MAX_SAMPLE_RUNS:,} (docs/limits.md): fewer iterations or modes")
    need, free = total * BYTES_PER_SAMPLE, _available_bytes()
    if free is not None and need > 0.8 * free:
        raise UserError(f"--iterations {w.iterations}: the simulation needs about {need / 2**30:.1f} GiB, "
                        f"this machine has {free / 2**30:.1f} GiB free")


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _check_outputs(args: Any) -> None:
    """Every output writable, none on an input (trace, calibration, preset file) or on another output."""
    outputs = [("--json", args.json), ("--plot", args.plot), ("--timeline", args.timeline)]
    inputs = [("--trace", args.trace), ("--calib", args.calib)]
    if Path(args.preset).exists():
        inputs.append(("--preset", args.preset))
    for flag, path in outputs:
        if path is not None:  # `--plot ""` is refused, not ignored
            check_output(path, inputs, flag)
    distinct_outputs(outputs)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.iterations is not None and args.iterations < 1:
        raise UserError(f"--iterations must be >= 1 (got {args.iterations})")
    modes = _modes(args.modes)
    counts = _int_list(args.instances, "--instances") if args.instances else []
    partial = [m for m in modes if partial_allowed(m)] if args.partial_rollout else []
    if args.partial_rollout and not partial:
        raise UserError("--partial-rollout: none of the selected modes is asynchronous and disaggregated")
    names = modes + [f"{m}+partial" for m in partial]
    if args.timeline and args.timeline_mode not in names:
        raise UserError(f"--timeline-mode '{args.timeline_mode}' is not among the simulated modes")
    _check_outputs(args)
    overrides = _overrides(args)
    preset = load_preset(args.preset, iterations=args.iterations, trace=args.trace, calib=args.calib,
                         overrides=overrides)
    if len(counts) > MAX_SWEEP_COUNTS:
        raise UserError(f"--instances: {len(counts)} counts, at most {MAX_SWEEP_COUNTS} (docs/limits.md)")
    _check_size(preset, max(len(names), len(modes) if counts else 0))  # a sweep step frees the one before
    workload = build_workload(preset)
    t0 = time.perf_counter()
    runs = _simulate_all(preset, workload, modes, partial if args.partial_rollout else None)
    rat = ratios(runs)
    print(
        f"## asp-npu bench sim --preset {preset.name}: {workload.num_iterations} iterations x "
        f"{workload.prompts_per_iteration} prompts x {workload.group_size} samples, "
        f"{preset.cluster.devices} devices"
    )
    for note in preset.notes:
        print(f"note: {note}")
    if workload.multi_turn:
        print("multi-turn: " + ", ".join(f"{k} {v}" for k, v in trajectory_summary(workload).items()))
    print()
    print(table(runs))
    print()
    print(ratio_table(rat, runs))
    if partial:
        print()
        print(partial_table(runs, partial))
    sweep = _sweep(preset, workload, modes, counts) if counts else {}
    print(f"\nsimulated in {time.perf_counter() - t0:.1f} s")
    if args.json:
        _write_json(args.json, preset, workload, runs, rat, sweep)
    if args.plot:
        plot(args.plot, runs, sweep or None, modes, preset.name)
    if args.timeline:
        r = runs[args.timeline_mode]
        ends = r.result.iteration_ends
        k = len(ends) // 2
        a = ends[k - 1] if k > 0 else 0.0
        write_timeline(args.timeline, r.result.log, a, ends[k])
    return 0
