"""How far a real run is from its limit: `x limit` and MFU, from the run's own measurements.

`x limit` is `bench sim`'s: the run's mean iteration time over the lower bound `asp_npu.sim.limit`
computes for the same mode, devices and work (`limit` itself is called, nothing is re-derived). Its
inputs come from the run, not from a calibration:
- the work: every consumed group's measured response lengths and prompt lengths (`samples.jsonl`),
  in iterations of `global_batch_size` prompts in the order they were consumed;
- the trainer: device-seconds per token = the run's total `timing/update` x trainer devices / the
  prompt + response tokens it trained (`sim.replay.trainer_cost_from_run`);
- decode: `a + b x batch` seconds per step, fitted to every generated sequence of the run (the
  engines' warm-up before the clock excluded; the windows in which a weight_refresh froze an
  instance's running sequences cut out of their lifetimes): a sequence
  that lived `d` seconds and generated `r` tokens while on average `n` sequences ran on its
  instance gives `d = a r + b r n` (least squares, both terms >= 0; prefill folds into `a`, the KV
  term into `b`; beyond `max_num_seqs` submitted sequences the engine runs that many at a time, so
  `n` is capped there and the lifetime stretched by `n / max_num_seqs`); the bound then charges each
  token `a / max_num_seqs + b` (full batch);
- the devices: the run's layout as the replay sees it (`sim.replay.layout_for_run`).

MFU: the model FLOPs of the trained tokens (`ModelDims.train_flops`: 6N + causal attention, x
`ppo_epochs`) over the update seconds, per trainer device, over one device's matmul FLOP/s (a timed
torch matmul, `trainer.calibrate.matmul_flops_per_s`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from asp_npu.core.records import GroupKey


def _sequences(events: Sequence[Mapping[str, Any]]) -> list[tuple[float, float, int]]:
    """(start, finish, tokens) of every finished sequence of one instance's events (warm-up excluded:
    a vLLM process's first generation pays seconds of one-off set-up that are not decode steps)."""
    from asp_npu.pipeline.queue_actor import WARMUP_PREFIX

    open_: dict[tuple[str, int], list[float]] = {}
    out = []
    for e in sorted(events, key=lambda e: float(e["t"])):
        key = (str(e.get("prompt_id")), int(e.get("sample_idx", 0)))
        if key[0].startswith(WARMUP_PREFIX):
            continue
        if e["event"] == "start":
            open_.setdefault(key, []).append(float(e["t"]))
        elif e["event"] == "finish" and open_.get(key):
            out.append((open_[key].pop(0), float(e["t"]), int(e.get("tokens", 0))))
    return out


def _mean_running(seqs: list[tuple[float, float, int]]) -> np.ndarray:
    """Each sequence's time-averaged count of sequences running beside it (itself included)."""
    marks = sorted([(s, 1) for s, _, _ in seqs] + [(f, -1) for _, f, _ in seqs])
    t = np.array([m[0] for m in marks])
    running = np.cumsum([m[1] for m in marks])  # after each mark
    area = np.concatenate([[0.0], np.cumsum(running[:-1] * np.diff(t))])  # integral of n(t) up to t
    s = np.array([x[0] for x in seqs])
    f = np.array([x[1] for x in seqs])
    d = np.maximum(f - s, 1e-12)
    return np.asarray((np.interp(f, t, area) - np.interp(s, t, area)) / d)


def _overlap(s: float, f: float, windows: Sequence[tuple[float, float]]) -> float:
    """Seconds of [s, f] inside the (disjoint or not) windows, each counted once."""
    cut, end = 0.0, s
    for a, b in sorted(windows):
        a, b = max(a, end), min(b, f)
        if b > a:
            cut += b - a
            end = b
    return cut


def decode_fit(instances: Iterable[Sequence[Mapping[str, Any]]], slots: int = 0,
               frozen: Sequence[Sequence[tuple[float, float]]] = ()) -> dict[str, float] | None:
    """Decode step `a + b x batch` from the run's sequence events (one list per instance); None with
    fewer than two sequences that generated tokens. With `slots` (max_num_seqs), `n` submitted
    sequences beyond the slots decode `slots` at a time: a sequence then lives `r (a + b slots) n /
    slots` (it waits its turn). `frozen[i]`: instance i's windows in which its running sequences were
    stopped (a weight_refresh's load); a sequence's lifetime inside them is not decode time."""
    rows = []
    for i, events in enumerate(instances):
        seqs = [x for x in _sequences(events) if x[2] > 0 and x[1] > x[0]]
        windows = frozen[i] if i < len(frozen) else ()
        if seqs:
            n = _mean_running(seqs)
            for (s, f, r), k in zip(seqs, n, strict=True):
                batch = min(k, slots) if slots else k
                wait = k / batch if batch > 0 else 1.0
                rows.append((max(f - s - _overlap(s, f, windows), 1e-12), r * wait, r * batch * wait))
    if len(rows) < 2:
        return None
    y, x = np.array([r[0] for r in rows]), np.array([[r[1], r[2]] for r in rows], dtype=float)
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    if a < 0 or b < 0:  # one term only, the one the data supports
        col = 1 if a < 0 else 0
        coef = float(x[:, col] @ y / (x[:, col] @ x[:, col]))
        a, b = (0.0, coef) if col == 1 else (coef, 0.0)
    return {"a": float(a), "b": float(b), "sequences": float(len(rows))}


def mfu(flops: float, update_s: float, devices: int, peak_per_device: float | None) -> float | None:
    """Achieved FLOP/s per device over the device's peak (None where the peak is unknown)."""
    if not peak_per_device or update_s <= 0 or devices < 1:
        return None
    return flops / update_s / devices / peak_per_device


def _workload(rows: Sequence[Mapping[str, Any]], group_size: int, per_iteration: int, iterations: int) -> Any:
    """The consumed groups, in consumption order, as whole iterations of `per_iteration` groups."""
    from asp_npu.sim.replay import build_workload, group_lengths

    lengths = group_lengths(rows, group_size)
    order = list(dict.fromkeys(GroupKey(str(r["prompt_id"]), int(r["epoch"])) for r in rows))
    iterations = min(iterations, len(order) // per_iteration)
    windows = [order[i * per_iteration:(i + 1) * per_iteration] for i in range(iterations)]
    plens = {str(r["prompt_id"]): int(r["prompt_len"]) for r in rows}
    return build_workload(windows, lengths, plens, per_iteration, max(1, iterations)), lengths, plens


def against_limit(raw_config: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], update_s: Sequence[float],
                  decode: Mapping[str, float], iteration_s: float, iterations: int,
                  cores: int | None = None) -> dict[str, Any]:
    """The run's bound and `x limit` (module docstring); `rows` are samples.jsonl's, `update_s` every
    step's `timing/update`, `decode` `decode_fit`'s, `iteration_s` the run's mean iteration time."""
    from asp_npu.sim.cost import SimCost
    from asp_npu.sim.limit import limit
    from asp_npu.sim.modes import SPECS
    from asp_npu.sim.preset import Cluster, Preset, RLSpec, WorkloadSpec
    from asp_npu.sim.replay import layout_for_run, settings_from_config, trainer_cost_from_run

    s = settings_from_config(raw_config)
    spec = SPECS[s.mode]
    layout = layout_for_run(s, s.mode, cores or len(os.sched_getaffinity(0)))
    workload, lengths, plens = _workload(rows, s.group_size, s.prompts_per_iteration, iterations)
    train = trainer_cost_from_run(update_s, lengths, plens, layout.trainer_devices)
    cost = SimCost(decode_a=max(decode["a"], 1e-12), decode_b=decode["b"], train_s_per_token=train,
                   train_dp_devices=max(1, layout.trainer_devices // max(1, s.trainer_dp)))
    cluster = Cluster(devices=layout.devices, infer_tp=s.infer_tp, max_num_seqs=s.max_num_seqs,
                      min_trainer_devices=1, sweep_trainer_devices=1)
    preset = Preset("run", cluster, WorkloadSpec(), RLSpec(), cost)  # what `limit` reads: cost, cluster
    bound = limit(preset, workload, spec.colocated_in_sim, spec.refresh_per_window)
    return {"x_limit": iteration_s / bound.iteration_s if bound.iteration_s > 0 else None,
            "limit_iteration_s": bound.iteration_s, "limit": bound.as_dict(),
            "iterations_bounded": workload.num_iterations, "train_s_per_token": train,
            "decode_step_s": {"a": decode["a"], "b_per_seq": decode["b"]},
            "decode_sequences_fitted": int(decode.get("sequences", 0)),
            "layout": {"devices": layout.devices, "instances": layout.instances,
                       "trainer_devices": layout.trainer_devices}}


def trained_flops(model_path: str, rows: Sequence[Mapping[str, Any]], epochs: int = 1) -> float:
    """Model FLOPs of training every consumed sample once per epoch (inputs are tokens[:-1])."""
    from asp_npu.arch import ModelDims

    dims = ModelDims.from_hf_dir(model_path)
    return epochs * dims.train_flops(max(1, int(r["prompt_len"]) + int(r["response_len"]) - 1) for r in rows)


def describe(against: Mapping[str, Any] | None) -> str:
    """One line: the run against its limit and its MFU, with the measured inputs of each."""
    a = against or {}
    if a.get("x_limit") is None:
        return f"against its limit: not computed ({a.get('why', 'not recorded')})"
    d = a["decode_step_s"]
    line = (f"{a['x_limit']:.2f}x its limit (bound {a['limit_iteration_s']:.2f} s/iteration from the run's "
            f"trainer {a['train_s_per_token']:.3e} device-s/token and decode {d['a'] * 1e3:.2f} ms + "
            f"{d['b_per_seq'] * 1e3:.3f} ms/seq, {a['decode_sequences_fitted']} sequences)")
    if a.get("mfu") is not None:
        per_device = a["trained_flops"] / a["update_s"] / a["layout"]["trainer_devices"]
        line += (f", MFU {a['mfu']:.1%} ({per_device / 1e9:.2f} GFLOP/s per trainer device of "
                 f"{a['matmul_flops_per_s'] / 1e9:.1f} measured)")
    return line
