"""Run modes on a preset and turn each run into the metrics the CLI and the JSON report print."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from asp_npu.core.modes import sim_mode
from asp_npu.data.traces import MultiTurnParams, SynthParams, read_trace, synth_multiturn, synth_trace
from asp_npu.errors import UserError
from asp_npu.observe.bubbles import account
from asp_npu.sim.contention import simulate_shared
from asp_npu.sim.cost import SimCost
from asp_npu.sim.engine import RunResult, RunSpec, Simulation, UnitSource
from asp_npu.sim.limit import limit
from asp_npu.sim.modes import (
    MODES,
    SPECS,
    DeviceSplit,
    candidate_splits,
    layout_for,
    pull_source,
    run_spec,
    static_source,
    trainer_cost,
)
from asp_npu.sim.planned import PlannedSource, planner_config
from asp_npu.sim.preset import Preset
from asp_npu.sim.workload import Workload, from_trace


def build_workload(preset: Preset) -> Workload:
    """The prompts every mode sees: the preset's trace, or its synthetic generator."""
    w = preset.workload
    if w.trace:
        trace = read_trace(w.trace)
    elif w.multi_turn:
        trace = synth_multiturn(MultiTurnParams(**{"n": w.n_samples_per_prompt, **w.multi_turn}))
    else:
        known = set(SynthParams.__dataclass_fields__)
        bad = sorted(set(w.synth) - known)
        if bad:
            raise UserError(f"{preset.path}: workload.synth: unknown key '{bad[0]}'")
        params = SynthParams(**{"n": w.n_samples_per_prompt, **w.synth})
        trace = synth_trace(params)
    wl = from_trace(trace, w.prompts_per_iteration, w.iterations, seed=w.seed)
    if wl.group_size != w.n_samples_per_prompt:
        raise UserError(
            f"{wl.source}: groups hold {wl.group_size} samples, preset says "
            f"n_samples_per_prompt={w.n_samples_per_prompt}"
        )
    return wl


@dataclass
class ModeRun:
    mode: str
    layout: DeviceSplit
    result: RunResult
    metrics: dict[str, Any]
    sim_seconds: float


def simulate(preset: Preset, workload: Workload, mode: str, instances: int | None = None) -> ModeRun:
    """Simulate one mode (optionally at a fixed instance count) and compute its metrics.

    With `cluster.split: search` a disaggregated mode runs every candidate split and keeps its best
    (the same search for every mode); `split: rule` uses `split_devices` directly. `rl.layout: auto`
    searches asp's split that way at a sweep point too (the point's device count, any trainer size).
    """
    if mode not in SPECS:
        raise UserError(f"unknown mode '{mode}' (modes: {', '.join(MODES)})")
    auto = mode == "asp" and preset.rl.layout == "auto"  # ASP's own split of the same devices
    if auto or instances is None and not SPECS[mode].colocated_in_sim and preset.cluster.split == "search":
        t0 = time.perf_counter()
        devices = None if instances is None else instances * preset.cluster.infer_tp + (
            preset.cluster.sweep_trainer_devices)  # the sweep point's device count, as every mode gets
        tried = [simulate_layout(preset, workload, mode, lay) for lay in candidate_splits(preset, devices)]
        best = max(tried, key=lambda r: r.metrics["throughput_tokens_per_s"])
        best.metrics["split_search"] = {
            f"{r.layout.instances}x{r.layout.instance_devices}+{r.layout.trainer_devices}T"
            + (f" TP{r.layout.trainer_tp}xPP{r.layout.trainer_pp}" if r.layout.trainer_tp else ""): round(
                r.metrics["throughput_tokens_per_s"], 1
            )
            for r in tried
        }
        best.sim_seconds = time.perf_counter() - t0
        return best
    return simulate_layout(preset, workload, mode, layout_for(mode, preset, workload, instances))


def simulate_layout(preset: Preset, workload: Workload, mode: str, layout: DeviceSplit) -> ModeRun:
    """Simulate one mode on a given device layout."""
    t0 = time.perf_counter()
    spec = run_spec(mode, preset, workload, layout)

    def once(cost: SimCost) -> RunResult:
        units_for, on_done, n_windows = work_source(preset, workload, mode, spec, layout)
        cost = trainer_cost(preset, cost, layout)  # a pipelined trainer shape pays its stages and bubble
        return Simulation(spec, workload, cost, units_for, on_done, n_windows).run()

    res, sharing = simulate_shared(preset.cost, spec.colocated, once,
                                   lambda r: float(np.diff(np.r_[0.0, r.iteration_ends]).mean()))
    elapsed = time.perf_counter() - t0
    out = metrics(res, workload)
    if sharing["applied"] or "colocated_decode_slowdown" in sharing:
        out["core_sharing"] = sharing
    # the bound on the devices this run has (a sweep point has its own count)
    on_devices = replace(preset, cluster=replace(preset.cluster, devices=layout.devices))
    lag = spec.max_token_lag if spec.partial_rollout else spec.max_lag
    bound = limit(on_devices, workload, spec.colocated, spec.barrier, lag, spec.version_groups)
    out["efficiency"] = out["iteration_time_mean_s"] / bound.iteration_s if bound.iteration_s > 0 else 1.0
    out["efficiency_hardware"] = out["iteration_time_mean_s"] / bound.hardware_iteration_s
    out["limit"] = bound.as_dict()
    return ModeRun(mode, layout, res, out, elapsed)


def work_source(preset: Preset, workload: Workload, mode: str, spec: RunSpec, layout: DeviceSplit
                ) -> tuple[UnitSource, Callable[[int], None] | None, int | None]:
    """(units_for, on_group_done, windows) of the mode: a dealt batch, single groups pulled in data
    order, or the window planner (ASP's plan, or FIFO units of the same size under unit execution)."""
    ms = sim_mode(mode, preset.rl.executor)
    if ms.deal:
        return static_source(workload, layout.instances, ms.deal), None, None
    slots, mb = preset.cluster.max_num_seqs, spec.version_groups * workload.group_size
    if ms.planner == "asp":
        cfg = planner_config(workload, preset.cost, layout.instances, slots, mb, spec.max_lag,
                             preset.workload.seed)
        window = 1 if ms.dispatch == "stream" else preset.rl.plan_window  # stream: one admission window
        src = PlannedSource(workload, ms, cfg, preset.cost, layout.trainer_devices, preset.rl.predictor,
                            seed=preset.workload.seed, window=window)
        return src, src.observe, src.n_windows
    if spec.unit_exec:
        cfg = planner_config(workload, None, layout.instances, slots, mb, spec.max_lag)
        fifo = PlannedSource(workload, ms, cfg, predictor=None, window=preset.rl.plan_window)
        return fifo, None, fifo.n_windows
    return pull_source(workload), None, None


def metrics(res: RunResult, workload: Workload) -> dict[str, Any]:
    ends = np.asarray(res.iteration_ends)
    it = np.diff(np.r_[0.0, ends])
    wall = res.wall_s
    b = account(res.log, 0.0, wall)
    q = res.queue.summary()
    lags = np.asarray(res.lags) if res.lags else np.zeros(1)
    hist = res.token_lag_hist
    n_tok = sum(hist.values())
    return {
        "throughput_tokens_per_s": res.tokens_consumed / wall if wall > 0 else 0.0,
        "samples_per_s": res.samples_consumed / wall if wall > 0 else 0.0,
        "iteration_time_mean_s": float(it.mean()),
        "iteration_time_p50_s": float(np.percentile(it, 50)),
        "iteration_time_p95_s": float(np.percentile(it, 95)),
        "wall_s": wall,
        "iterations": int(ends.size),
        "tokens_generated": res.tokens_generated,
        "tokens_in_trace": workload.total_response_tokens,
        "utilization": b.utilization,
        "bubbles": {
            "padding": b.padding,
            "skewness": b.skewness,
            "sorting": b.sorting,
            "overhead": b.overhead,
        },
        "trainer_idle_ratio": b.trainer_idle_ratio,
        "rollouter_idle_ratio": b.rollouter_idle_ratio,
        "accounting_coverage": b.coverage,
        "lag_mean": float(lags.mean()),
        "lag_max": int(lags.max()),
        "token_lag": {  # every consumed token's lag (trainer step - weights version that generated it)
            "hist": {str(k): v for k, v in hist.items()},
            "mean": sum(k * v for k, v in hist.items()) / n_tok if n_tok else 0.0,
            "max": max(hist, default=0),
        },
        "queue": {k: q[k] for k in ("queued_mean", "queued_max", "in_flight_mean", "in_flight_max")},
        "layout": {
            "devices": res.spec.devices,
            "instances": res.spec.instances,
            "instance_devices": res.spec.instance_devices,
            "trainer_devices": res.spec.trainer_devices,
            "colocated": res.spec.colocated,
            "max_lag": res.spec.max_lag,
            **({"max_token_lag": res.spec.max_token_lag} if res.spec.partial_rollout else {}),
            "minibatch_samples": res.spec.minibatch_groups * workload.group_size,
        },
    }


def run_modes(
    preset: Preset,
    workload: Workload,
    modes: tuple[str, ...] | list[str] = MODES,
    instances: int | None = None,
) -> dict[str, ModeRun]:
    return {m: simulate(preset, workload, m, instances) for m in modes}
