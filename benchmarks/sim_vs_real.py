"""Does the simulator's `cpu` preset predict the real pipeline? Simulated vs measured mean iteration time.

Usage:
    .venv/bin/python benchmarks/sim_vs_real.py --run-dir DIR --calib calib.json [--json out.json]
        [--run-costs trainer,switch|none] [--cores N] [--prompt-len N] [--preset cpu] [--no-sim-padding]

DIR is the `--out-dir` of `asp-npu bench real` (one run directory per mode and seed: asp_s1,
async-fifo_s1, mindspeed-sync_s2, ...) or a single run directory; `--calib` is the `asp-calib/1` file
written by `asp-npu calibrate`. Issue #6: the preset must predict each mode's measured mean iteration
time within 15%.

For every complete run (config.yaml, samples.jsonl, metrics.jsonl, summary.json) the simulator replays
THAT run (`asp_npu.sim.replay`):
- workload: the run's own measured response lengths (samples.jsonl), the same groups (prompt, epoch)
  per iteration as its planning windows (plans/window_*.json; ordered as the data loader handed them
  out when the run's dataset can be rebuilt, else in plan order; without plans: by consuming step),
  prompt lengths from samples.jsonl if recorded, else the run's dataset tokenized by the run's
  model tokenizer, else `--prompt-len`;
- settings from its config.yaml: mode, instances, infer TP, max_num_seqs, admission (continuous ->
  `stream` executor, unit -> `unit`), n_samples_per_prompt, mini_batch_size, global_batch_size,
  the mode's effective lag bound and refresh period, predictor, micro_batch_size, train_iters;
- layout: instances x TP devices (cores); asynchronous modes a separate trainer of the cores the
  controller gives it (at least one per rank), mindspeed-sync colocated on the instances' cores;
  where rollout and training overlap, the calibrated core-sharing slowdowns apply
  (`asp_npu.sim.contention`; both measured by `asp-npu calibrate` in the run's placement);
- costs: the `--preset` fallbacks overlaid by the calibration file (decode a/b/c, prefill, refresh,
  trainer s/token for the asynchronous and the colocated placement, core-sharing slowdowns, when
  present). Costs the calibration does not measure come from the run itself
  when `--run-costs` allows it (default `trainer,switch`): trainer device-seconds per token = the
  run's total `timing/update` (metrics.jsonl) x trainer devices / consumed prompt+response tokens;
  colocated switch seconds (rollout->train, train->rollout) from events.json. Every cost's source is
  printed. Nothing is fitted to the iteration time.

The simulator's mindspeed-sync trainer pads data-order micro-batches (MindSpeed-RL); the real trainer
sorts by length and its padding is already inside a run-measured trainer cost, so the script prints how
much the simulated padding adds; `--no-sim-padding` simulates that trainer with micro_batch_size 1.

Prints one table (mode, seed, measured, simulated, signed error) and the median error per mode;
`--json OUT` writes everything, including each cost and its source. Cheap: seconds per run (the
first run that needs prompt lengths loads the model's tokenizer).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from asp_npu.errors import UserError
from asp_npu.io import atomic_write_json
from asp_npu.sim.cost import train_seconds
from asp_npu.sim.modes import SPECS as SIM_SPECS
from asp_npu.sim.preset import CALIB_SCHEMA, Preset
from asp_npu.sim.replay import (
    GroupKey,
    RunSettings,
    build_workload,
    group_lengths,
    layout_for_run,
    preset_for_run,
    read_jsonl,
    settings_from_config,
    split_group_id,
    switch_costs_from_events,
    trainer_cost_from_run,
    windows_from_plans,
    windows_from_samples,
)
from asp_npu.sim.run import simulate_layout
from asp_npu.sim.workload import Workload

TOLERANCE = 0.15  # issue #6
NEEDED = ("config.yaml", "samples.jsonl", "metrics.jsonl", "summary.json")
# calib key -> SimCost field (asp_npu.sim.preset.apply_calibration)
CALIB_FIELDS = {
    "decode_step_s.a": "decode_a",
    "decode_step_s.b_per_seq": "decode_b",
    "decode_step_s.c_per_kv_token": "decode_c",
    "prefill_s_per_token": "prefill_s_per_token",
    "refresh_s": "refresh_s",
    "trainer_s_per_token": "train_s_per_token",
    "trainer_step_s": "train_step_s",
    "core_sharing.decode_slowdown": "share_decode_slowdown",
    "core_sharing.train_slowdown": "share_train_slowdown",
    "core_sharing.colocated_decode_slowdown": "colocated_decode_slowdown",
}
COLOCATED_TRAINER = "trainer_s_per_token_colocated"  # the colocated modes' trainer (every core)
COLOCATED_STEP = "trainer_step_s_colocated"
# how each real mode maps onto the simulator's mode of the same name, where they differ in architecture
ARCH_NOTES = {
    "sortedrl": "NOT COMPARABLE: the simulator's sortedrl is colocated with partial rollout (preempt + "
    "resume); the real one is disaggregated and keeps unfinished samples running",
}


def find_runs(root: Path) -> tuple[list[Path], list[str]]:
    """Complete run directories under `root` (or `root` itself), and why others were skipped."""
    if (root / "config.yaml").is_file():
        cands = [root]
    else:
        cands = sorted(p for p in root.iterdir() if p.is_dir() and (p / "config.yaml").is_file())
    runs, skipped = [], []
    for p in cands:
        missing = [f for f in NEEDED if not (p / f).is_file() or (p / f).stat().st_size == 0]
        if missing:
            skipped.append(f"{p.name}: skipped (missing or empty: {', '.join(missing)})")
        else:
            runs.append(p)
    if not runs and not skipped:
        raise UserError(f"{root}: no run directories (each needs {', '.join(NEEDED)})")
    return runs, skipped


def calib_fields(path: Path) -> dict[str, float | None]:
    """SimCost field -> the calibrated value (None: not measured, the preset's fallback applies)."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: cannot read calibration ({exc})") from None
    if not isinstance(d, dict) or d.get("schema") != CALIB_SCHEMA:
        raise UserError(f"{path}: not an {CALIB_SCHEMA} calibration file")
    out: dict[str, float | None] = {}
    for key, attr in CALIB_FIELDS.items():
        v: Any = d
        for part in key.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        out[attr] = None if v is None else float(v)
    for key in (COLOCATED_TRAINER, COLOCATED_STEP):
        v = d.get(key)
        out[key] = None if v is None else float(v)
    return out


DatasetInfo = tuple[dict[str, int] | None, Callable[[int], list[GroupKey]] | None, str]
_DATASETS: dict[str, DatasetInfo] = {}


def dataset_info(raw: Mapping[str, Any], s: RunSettings, need_lengths: bool) -> DatasetInfo:
    """The run's prompts rebuilt from its config: (prompt_id -> prompt tokens, or None; window index ->
    groups in data-loader order, or None; a note saying what worked). Cached per data/model config.

    Prompt tokens as the controller counts them (`encode_prompt` with the model's tokenizer); the order
    is the controller's own `window_stream`. Any failure only means a fallback, and the note says why.
    """
    from asp_npu.config import DataConfig

    data, model = raw.get("data") or {}, raw.get("model") or {}
    model_path = str(model.get("path", ""))
    key = json.dumps([data, model_path, s.prompts_per_iteration, need_lengths], sort_keys=True, default=str)
    if key in _DATASETS:
        return _DATASETS[key]
    d = DataConfig()
    try:
        from asp_npu.data.datasets import load_prompts

        prompts = load_prompts(
            str(data.get("data_path", d.data_path) or ""),
            str(data.get("task", d.task)),
            int(data.get("num_prompts", d.num_prompts)),
            int(data.get("seed", d.seed)),
            str(data.get("length_dist", "") or ""),
        )
    except Exception as exc:  # noqa: BLE001 - any failure: fall back, and say why
        _DATASETS[key] = (None, None, f"dataset not rebuilt ({type(exc).__name__}: {str(exc)[:80]})")
        return _DATASETS[key]
    order: Callable[[int], list[GroupKey]] | None = None
    note = "dataset rebuilt"
    try:
        from asp_npu.core.window import window_stream

        get = window_stream(prompts, s.prompts_per_iteration, s.data_seed)
        order = lambda w: [split_group_id(it.prompt_id) for it in get(w)]  # noqa: E731
    except Exception as exc:  # noqa: BLE001
        note += f"; data-loader order unavailable ({type(exc).__name__})"
    lens: dict[str, int] | None = None
    if need_lengths:
        try:
            from asp_npu.data.datasets import encode_prompt

            tok = None
            if any(not p.prompt_token_ids for p in prompts):
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(model_path)
            lens = {p.prompt_id: len(encode_prompt(p, tok)) for p in prompts}
            note += f"; prompt lengths tokenized with {model_path}"
        except Exception as exc:  # noqa: BLE001
            note += f"; prompt lengths unavailable ({type(exc).__name__}: {str(exc)[:80]})"
    _DATASETS[key] = (lens, order, note)
    return _DATASETS[key]


def run_windows(
    run: Path, rows: list[dict[str, Any]], s: RunSettings, order: Callable[[int], list[GroupKey]] | None
) -> tuple[list[list[GroupKey]], str]:
    """Each iteration's groups in dispatch order, and where they came from."""
    if (run / "plans").is_dir() and any((run / "plans").glob("window_*.json")):
        wins = windows_from_plans(run / "plans")
        src = "plans"
        if order is not None:
            loader = [order(w) for w in range(len(wins))]
            if all(set(a) == set(b) for a, b in zip(loader, wins, strict=True)):
                return loader, "plans (data-loader order)"
            src = "plans (plan order: the rebuilt data loader disagrees)"
        return wins, src
    return windows_from_samples(rows, s.steps_per_iteration), "samples.jsonl consuming step (no plans)"


def seed_of(run: Path, s: RunSettings) -> int:
    m = re.search(r"_s(\d+)$", run.name)
    return int(m.group(1)) if m else s.data_seed


def padding_factor(preset: Preset, workload: Workload, trainer_devices: int) -> float:
    """Simulated padded-trainer seconds over unpadded ones (mindspeed-sync: data-order micro-batches)."""
    padded = plain = 0.0
    for it in range(workload.num_iterations):
        g = workload.iteration_groups(it)
        tokens = (workload.response_len[g] + workload.prompt_len[g, None]).ravel()
        padded += train_seconds(preset.cost, tokens, trainer_devices, True)[0]
        plain += train_seconds(preset.cost, tokens, trainer_devices, False)[0]
    return padded / plain if plain > 0 else 1.0


def compare_run(
    run: Path,
    calib: Path,
    calibrated: dict[str, float | None],
    run_costs: set[str],
    cores: int,
    prompt_len_flag: int | None,
    base: str,
    sim_padding: bool = True,
) -> dict[str, Any]:
    """Simulate one real run; the row of the table (and every input, with its source)."""
    import yaml

    raw = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8")) or {}
    s = settings_from_config(raw)
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    rows = read_jsonl(run / "samples.jsonl")
    metric_rows = read_jsonl(run / "metrics.jsonl")
    notes: list[str] = []
    sim_mode = s.mode
    if sim_mode not in SIM_SPECS:
        raise UserError(f"{run.name}: mode '{sim_mode}' has no simulator mode")
    if sim_mode in ARCH_NOTES:
        notes.append(ARCH_NOTES[sim_mode])
    iterations = int(summary.get("iterations") or s.iterations)
    if iterations != s.iterations:
        notes.append(f"run finished {iterations} of train_iters={s.iterations} iterations")
    lengths = group_lengths(rows, s.group_size)

    # prompt lengths: recorded > dataset tokenized > --prompt-len
    plens: dict[str, int] | int
    if rows and all("prompt_len" in r for r in rows):
        plens = {str(r["prompt_id"]): int(r["prompt_len"]) for r in rows}
        plen_src = "samples.jsonl"
        _, order, ds_note = dataset_info(raw, s, need_lengths=False)
    else:
        ds_lens, order, ds_note = dataset_info(raw, s, need_lengths=True)
        if ds_lens is not None:
            plens, plen_src = ds_lens, "dataset tokenized"
        elif prompt_len_flag is not None:
            plens, plen_src = prompt_len_flag, f"--prompt-len {prompt_len_flag}"
        else:
            raise UserError(f"{run.name}: prompt lengths unknown ({ds_note}); pass --prompt-len N")
    windows, win_src = run_windows(run, rows, s, order)
    workload = build_workload(windows, lengths, plens, s.prompts_per_iteration, iterations, source=run.name)
    consumed = {k for k in lengths}
    planned = {k for w in windows[:iterations] for k in w}
    if consumed != planned:
        notes.append(f"{len(consumed - planned)} consumed groups are outside the first {iterations} windows")

    layout = layout_for_run(s, sim_mode, cores)
    cost: dict[str, float] = {}
    sources = {
        attr: ("calib" if calibrated.get(attr) is not None else f"preset {base} fallback")
        for attr in CALIB_FIELDS.values()
    }
    updates = [float(r["timing/update"]) for r in metric_rows if "timing/update" in r]
    metric_tokens = sum(float(r.get("actor/response_tokens", 0.0)) for r in metric_rows)
    sample_tokens = sum(int(v.sum()) for v in lengths.values())
    if metric_tokens and abs(metric_tokens - sample_tokens) > 0.5:
        notes.append(
            f"metrics.jsonl counts {metric_tokens:.0f} response tokens, samples.jsonl {sample_tokens}"
        )
    if len(updates) != iterations * s.steps_per_iteration:
        notes.append(
            f"{len(updates)} timing/update rows for {iterations * s.steps_per_iteration} trainer steps"
        )
    colocated = SIM_SPECS[sim_mode].colocated_in_sim
    if colocated and calibrated.get(COLOCATED_TRAINER) is not None:
        cost["train_s_per_token"] = float(calibrated[COLOCATED_TRAINER])  # type: ignore[arg-type]
        sources["train_s_per_token"] = "calib (colocated trainer on every core)"
        if calibrated.get(COLOCATED_STEP) is not None:
            cost["train_step_s"] = float(calibrated[COLOCATED_STEP])  # type: ignore[arg-type]
            sources["train_step_s"] = "calib (colocated trainer on every core)"
    elif calibrated.get("train_s_per_token") is None and "trainer" in run_costs:
        cost["train_s_per_token"] = trainer_cost_from_run(updates, lengths, plens, layout.trainer_devices)
        sources["train_s_per_token"] = f"run metrics ({len(updates)} steps of timing/update)"
    sources["to_train_s"] = sources["to_infer_s"] = f"preset {base} fallback"
    if SIM_SPECS[sim_mode].colocated_in_sim and "switch" in run_costs and (run / "events.json").is_file():
        sw = switch_costs_from_events(json.loads((run / "events.json").read_text(encoding="utf-8")))
        if sw is not None:
            cost["to_train_s"], cost["to_infer_s"] = sw[0], sw[1]
            sources["to_train_s"] = sources["to_infer_s"] = f"run events.json ({sw[2]} windows)"
    dynamic_bsz = bool((raw.get("actor_config") or {}).get("use_dynamic_bsz", False))
    if (not sim_padding or dynamic_bsz) and SIM_SPECS[sim_mode].trainer_padded:
        cost["micro_batch_size"] = 1  # no data-order padding on top of the measured per-token cost
        notes.append("the padded trainer simulated with micro_batch_size 1 ("
                     + ("the run's trainer used use_dynamic_bsz)" if dynamic_bsz else "--no-sim-padding)"))
    preset = preset_for_run(s, layout, str(calib), cost, base=base)
    t0 = time.perf_counter()
    res = simulate_layout(preset, workload, sim_mode, layout)
    sim_s = time.perf_counter() - t0
    measured = float(summary["iteration_time_mean_s"])
    simulated = float(res.metrics["iteration_time_mean_s"])
    out_cost = {
        k: getattr(preset.cost, k)
        for k in (*CALIB_FIELDS.values(), "to_train_s", "to_infer_s", "micro_batch_size", "train_dp_devices")
    }
    row: dict[str, Any] = {
        "run": run.name,
        "mode": s.mode,
        "seed": seed_of(run, s),
        "measured_iteration_time_mean_s": measured,
        "simulated_iteration_time_mean_s": simulated,
        "error": simulated / measured - 1.0 if measured > 0 else float("nan"),
        "measured_throughput_tokens_per_s": summary.get("throughput_tokens_per_s"),
        "simulated_throughput_tokens_per_s": res.metrics["throughput_tokens_per_s"],
        "measured_wall_s": summary.get("wall_s"),
        "simulated_wall_s": res.metrics["wall_s"],
        "iterations": iterations,
        "settings": s.__dict__ | {"executor": s.executor},
        "layout": {
            "devices": layout.devices,
            "instances": layout.instances,
            "instance_devices": layout.instance_devices,
            "trainer_devices": layout.trainer_devices,
            "colocated": SIM_SPECS[sim_mode].colocated_in_sim,
            "cores": cores,
        },
        "costs": out_cost,
        "cost_sources": {k: sources.get(k, "run config.yaml") for k in out_cost},
        "workload": {
            "groups": workload.num_groups,
            "group_size": workload.group_size,
            "response_tokens": workload.total_response_tokens,
            "response_len_mean": float(workload.response_len.mean()),
            "response_len_max": int(workload.response_len.max()),
            "prompt_len_mean": float(workload.prompt_len.mean()),
            "windows_from": win_src,
            "prompt_len_from": plen_src,
            "dataset": ds_note,
        },
        "simulated": {
            k: res.metrics[k] for k in ("utilization", "bubbles", "trainer_idle_ratio", "lag_mean")
        } | {"core_sharing": res.metrics.get("core_sharing", {"applied": False})},
        "measured": {k: summary.get(k) for k in ("bubbles", "trainer_idle_ratio", "lag_mean")},
        "measured_update_s_total": float(sum(updates)),
        "sim_seconds": sim_s,
        "notes": notes,
    }
    if SIM_SPECS[sim_mode].trainer_padded and sim_padding:
        f = padding_factor(preset, workload, layout.trainer_devices)
        row["sim_trainer_padding_factor"] = f
        notes.append(
            f"the simulator's {sim_mode} trainer pads data-order micro-batches of "
            f"{preset.cost.micro_batch_size} (MindSpeed-RL): its training takes {f:.2f}x the run's "
            "measured update time"
        )
    return row


def per_mode(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        rs = [r for r in rows if r["mode"] == mode]
        err = np.array([r["error"] for r in rs])
        meas = float(np.mean([r["measured_iteration_time_mean_s"] for r in rs]))
        sim = float(np.mean([r["simulated_iteration_time_mean_s"] for r in rs]))
        med = float(np.median(err))
        out[mode] = {
            "runs": len(rs),
            "median_error": med,
            "worst_abs_error": float(np.max(np.abs(err))),
            "measured_mean_s": meas,
            "simulated_mean_s": sim,
            "error_of_means": sim / meas - 1.0 if meas > 0 else float("nan"),
            "within_tolerance": bool(abs(med) <= TOLERANCE),
            "comparable": mode not in ARCH_NOTES,
        }
    return out


def sharing_cell(r: dict[str, Any]) -> str:
    sh = r["simulated"]["core_sharing"]
    if "colocated_decode_slowdown" in sh:
        return f"colocated decode x{sh['colocated_decode_slowdown']:.2f}"
    if not sh.get("applied"):
        return "-"
    return (f"{sh['decode_factor']:.2f} ({sh['decode_overlap']:.0%} of decode overlapped) / "
            f"{sh['train_factor']:.2f} ({sh['train_overlap']:.0%} of training)")


def render(rows: list[dict[str, Any]], modes: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| mode | seed | measured iter s | simulated iter s | error % | trainer s/token (source) | "
        "to_train / to_infer s (source) | core sharing: decode x / train x |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, src = r["costs"], r["cost_sources"]
        sw = "-"
        if r["layout"]["colocated"]:
            sw = f"{c['to_train_s']:.3f} / {c['to_infer_s']:.3f} ({src['to_train_s']})"
        lines.append(
            f"| {r['mode']} | {r['seed']} | {r['measured_iteration_time_mean_s']:.3f} | "
            f"{r['simulated_iteration_time_mean_s']:.3f} | {100 * r['error']:+.1f} | "
            f"{c['train_s_per_token']:.3g} ({src['train_s_per_token']}) | {sw} | {sharing_cell(r)} |"
        )
    lines += [
        "",
        f"| mode | runs | median error % | worst abs error % | measured mean s | simulated mean s | "
        f"within {100 * TOLERANCE:.0f}% (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, x in modes.items():
        ok = ("yes" if x["within_tolerance"] else "NO") + ("" if x["comparable"] else " (not comparable)")
        lines.append(
            f"| {m} | {x['runs']} | {100 * x['median_error']:+.1f} | {100 * x['worst_abs_error']:.1f} | "
            f"{x['measured_mean_s']:.3f} | {x['simulated_mean_s']:.3f} | {ok} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", required=True, help="bench real --out-dir (or one run directory)")
    ap.add_argument("--calib", required=True, help="asp-calib/1 file from `asp-npu calibrate`")
    ap.add_argument("--json", help="write rows, per-mode errors, costs and their sources as JSON")
    ap.add_argument(
        "--run-costs",
        default="trainer,switch",
        help="costs the calibration lacks that may be measured from each run: trainer, switch, or none "
        "(then the preset's fallbacks apply); default trainer,switch",
    )
    ap.add_argument("--cores", type=int, help="cores the runs had (default: this machine's usable cores)")
    ap.add_argument(
        "--prompt-len", type=int, help="prompt tokens, when neither samples nor dataset give them"
    )
    ap.add_argument("--preset", default="cpu", help="base preset (fallback costs); default cpu")
    ap.add_argument(
        "--no-sim-padding",
        dest="sim_padding",
        action="store_false",
        help="simulate padded-trainer modes (mindspeed-sync) with micro_batch_size 1: no data-order padding "
        "on top of a trainer cost measured in the run (which already holds the real trainer's padding)",
    )
    args = ap.parse_args(argv)
    try:
        run_costs = {x.strip() for x in args.run_costs.split(",") if x.strip()} - {"none"}
        bad = run_costs - {"trainer", "switch"}
        if bad:
            raise UserError(f"--run-costs: unknown '{sorted(bad)[0]}' (trainer, switch, none)")
        calib = Path(args.calib)
        calibrated = calib_fields(calib)
        cores = args.cores or len(os.sched_getaffinity(0))
        runs, skipped = find_runs(Path(args.run_dir))
        rows = [
            compare_run(
                r, calib, calibrated, run_costs, cores, args.prompt_len, args.preset, args.sim_padding
            )
            for r in runs
        ]
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print(f"error: no complete run under {args.run_dir} ({'; '.join(skipped)})", file=sys.stderr)
        return 1
    modes = per_mode(rows)
    print(f"## sim vs real: {args.run_dir} with --calib {calib} (preset {args.preset}, {cores} cores)")
    print()
    for attr, v in calibrated.items():
        if v is None and attr in CALIB_FIELDS.values():
            src = (
                "run metrics" if attr == "train_s_per_token" and "trainer" in run_costs else "preset fallback"
            )
            print(f"note: {attr}: not in the calibration file -> {src}")
    if rows:
        c = rows[0]["costs"]
        print(
            f"note: decode step {c['decode_a'] * 1e3:.3f} ms + {c['decode_b'] * 1e3:.4f} ms/seq + "
            f"{c['decode_c'] * 1e6:.4f} us/KV token; prefill {c['prefill_s_per_token']:.2e} s/token; "
            f"refresh {c['refresh_s']:.3f} s; core sharing: decode x{c['share_decode_slowdown']:.2f}, "
            f"trainer x{c['share_train_slowdown']:.2f} while the other side is busy"
        )
    for line in skipped:
        print(f"note: {line}")
    print()
    print(render(rows, modes))
    print()
    lines: dict[str, None] = {}
    for r in rows:
        w = r["workload"]
        where = f"groups per iteration from {w['windows_from']}; prompt lengths: {w['prompt_len_from']}"
        lines[f"{r['mode']}: {where}"] = None
    for r in rows:
        for n in r["notes"]:
            lines[f"{r['mode']} s{r['seed']}: {n}"] = None
    for line in lines:
        print(f"- {line}")
    if args.json:
        doc = {
            "run_dir": str(args.run_dir),
            "calib": str(calib),
            "calibrated_fields": calibrated,
            "preset": args.preset,
            "cores": cores,
            "run_costs": sorted(run_costs),
            "tolerance": TOLERANCE,
            "skipped": skipped,
            "runs": rows,
            "modes": modes,
        }
        atomic_write_json(args.json, json.loads(json.dumps(doc, default=float)), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
