"""Replay a real run directory (`asp-npu train` / `asp-npu bench real`) in the simulator.

A run directory holds what the simulator needs to redo the same work:

- `samples.jsonl`: every consumed sample's measured `response_len`, keyed by `prompt_id`, `epoch` and
  `sample_idx` (a GRPO group = one prompt in one epoch);
- `plans/window_*.json`: which groups each planning window (= one iteration, `global_batch_size`
  prompts) held, as `<prompt_id>@<epoch>`;
- `config.yaml`: instances, slots, batch shape, lag bound, refresh interval, mode, trainer ranks.

This module turns them into a `Workload` with the same groups per iteration and the same lengths
(no reshuffle -- unlike `workload.from_trace`, which cuts a trace with its own data-loader shuffle),
the run's `RunSettings`, the simulator `DeviceSplit` of the run's devices, a `Preset` with those settings,
and the costs a calibration file does not hold but the run itself measured (trainer device-seconds
per token from `timing/update`; colocated switch seconds from `events.json`).
`benchmarks/sim_vs_real.py` compares the simulated iteration time with the measured one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from asp_npu import io
from asp_npu.core.modes import REAL_MODES, instances_on
from asp_npu.core.records import GroupKey
from asp_npu.core.shape import RunShape, shape_problems
from asp_npu.errors import UserError
from asp_npu.sim.modes import SPECS as SIM_SPECS
from asp_npu.sim.modes import DeviceSplit
from asp_npu.sim.preset import Preset, load_preset
from asp_npu.sim.workload import Workload

_STEP_KEYS = ("trainer_step", "step")


@dataclass(frozen=True)
class RunSettings:
    """What a real run's config.yaml says about the work and the devices (effective values per mode)."""

    mode: str
    colocated: bool  # the real mode alternates rollout and training on the same devices
    instances: int  # generate_config.num_instances
    infer_tp: int  # generate_config.infer_tensor_parallel_size
    max_num_seqs: int
    admission: str  # continuous | unit (after the mode's fixed admission)
    group_size: int  # rl_config.n_samples_per_prompt
    mini_batch_size: int  # samples per trainer step
    prompts_per_iteration: int  # rl_config.global_batch_size (0 -> one minibatch of groups)
    iterations: int  # trainer.train_iters
    max_lag: int  # effective bound (one-step-off: 1, mindspeed-sync: 0)
    steps_per_version: int  # trainer steps per weight refresh (weight_refresh_interval or a window)
    predictor: str
    micro_batch_size: int  # actor_config.micro_batch_size
    trainer_world: int  # TP x PP x DP
    trainer_dp: int
    trainer_threads: int  # actor_config.num_threads (0 = the controller's automatic placement)
    data_seed: int
    devices_per_node: int  # trainer.n_devices_per_node (0 = every usable core)

    @property
    def steps_per_iteration(self) -> int:
        return self.prompts_per_iteration * self.group_size // self.mini_batch_size

    @property
    def executor(self) -> str:
        """The simulator's executor for this admission: continuous batching = stream, unit = unit."""
        return "stream" if self.admission == "continuous" else "unit"


def settings_from_config(raw: Mapping[str, Any]) -> RunSettings:
    """A run's config snapshot (the YAML mapping) -> RunSettings; missing keys take asp_npu.config defaults.

    The run's shape (`asp_npu.core.shape.RunShape`) decides the effective admission, lag bound and
    refresh period, exactly as the controller derives them.
    """
    from asp_npu.config import config_from_mapping

    cfg = config_from_mapping(raw)
    rl, act = cfg.rl_config, cfg.actor_config
    if rl.mode not in REAL_MODES:
        real = ", ".join(REAL_MODES)
        raise UserError(f"config: rl_config.mode '{rl.mode}' is not a real-engine mode ({real})")
    problems = shape_problems(cfg)
    if problems:
        raise UserError(f"config: {problems[0]}")
    sh = RunShape.from_config(cfg)
    return RunSettings(
        mode=rl.mode,
        colocated=sh.mode.colocated,
        instances=cfg.generate_config.num_instances,
        infer_tp=sh.infer_tp,
        max_num_seqs=sh.slots,
        admission=sh.mode.admission,
        group_size=sh.group_size,
        mini_batch_size=sh.minibatch,
        prompts_per_iteration=sh.window,
        iterations=sh.iterations,
        max_lag=sh.max_lag,
        steps_per_version=sh.steps_per_version,
        predictor=rl.predictor,
        micro_batch_size=act.micro_batch_size,
        trainer_world=sh.trainer_world,
        trainer_dp=sh.trainer_dp,
        trainer_threads=act.num_threads,
        data_seed=cfg.data.seed,
        devices_per_node=cfg.trainer.n_devices_per_node,
    )


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a run's JSONL file (`asp_npu.io.read_jsonl`: a malformed line names file:line)."""
    return [row for _, row in io.read_jsonl(path)]


def split_group_id(gid: str) -> GroupKey:
    """`<prompt_id>@<epoch>` (the controller's instance-level group id) -> GroupKey."""
    try:
        return GroupKey.parse(gid)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def group_lengths(rows: Iterable[Mapping[str, Any]], group_size: int) -> dict[GroupKey, np.ndarray]:
    """samples.jsonl rows -> {(prompt_id, epoch): response lengths by sample_idx}; every group complete."""
    seen: dict[GroupKey, dict[int, int]] = {}
    for i, r in enumerate(rows, 1):
        try:
            key = GroupKey(str(r["prompt_id"]), int(r["epoch"]))
            k, length = int(r["sample_idx"]), int(r["response_len"])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"samples row {i}: needs prompt_id, epoch, sample_idx and response_len") from None
        d = seen.setdefault(key, {})
        if k in d:
            raise UserError(f"samples row {i}: duplicate sample {key[0]}@{key[1]}#{k}")
        d[k] = length
    out: dict[GroupKey, np.ndarray] = {}
    for key, d in seen.items():
        if sorted(d) != list(range(group_size)):
            raise UserError(
                f"samples: group {key[0]}@{key[1]} has samples {sorted(d)}, expected 0..{group_size - 1}"
            )
        out[key] = np.array([d[k] for k in range(group_size)], dtype=np.int64)
    return out


def windows_from_plans(plan_dir: str | Path) -> list[list[GroupKey]]:
    """Each planning window's groups (`plans/window_*.json`), in unit-id order then sample order.

    For FIFO plans that is the data-loader order of the window; for ASP plans it is the plan's order.
    """
    d = Path(plan_dir)
    files = sorted(d.glob("window_*.json"))
    if not files:
        raise UserError(f"{d}: no window_*.json plans")
    out: list[list[GroupKey]] = []
    for want, f in enumerate(files):
        m = re.fullmatch(r"window_(\d+)\.json", f.name)
        if m is None or int(m.group(1)) != want:
            raise UserError(f"{d}: plans are not window_0000.json .. in sequence (found {f.name})")
        try:
            plan = json.loads(f.read_text(encoding="utf-8"))
            units = [u for inst in plan["instances"] for u in inst["units"]]
            units.sort(key=lambda u: int(u["unit"]))
            ids = [s["prompt_id"] for u in units for s in u["samples"]]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise UserError(f"{f}: not an asp-plan/1 file") from None
        out.append([split_group_id(g) for g in dict.fromkeys(ids)])
    return out


def windows_from_samples(rows: Sequence[Mapping[str, Any]], steps_per_iteration: int) -> list[list[GroupKey]]:
    """Fallback without plans: a group's iteration = the trainer step that consumed it // steps per
    iteration; order inside an iteration = first appearance in samples.jsonl. Exact for synchronous
    modes; asynchronous ones may consume a group one iteration after the window that dispatched it."""
    if steps_per_iteration < 1:
        raise UserError("steps_per_iteration must be >= 1")
    first: dict[GroupKey, int] = {}
    for i, r in enumerate(rows, 1):
        step = next((r[k] for k in _STEP_KEYS if k in r), None)
        if step is None:
            raise UserError(f"samples row {i}: needs a trainer_step or step field")
        key = GroupKey(str(r["prompt_id"]), int(r["epoch"]))
        it = int(step) // steps_per_iteration
        first[key] = min(first.get(key, it), it)
    n_it = max(first.values()) + 1 if first else 0
    out: list[list[GroupKey]] = [[] for _ in range(n_it)]
    for key, it in first.items():
        out[it].append(key)
    return out


def build_workload(
    windows: Sequence[Sequence[GroupKey]],
    lengths: Mapping[GroupKey, np.ndarray],
    prompt_len: Mapping[str, int] | int,
    prompts_per_iteration: int,
    iterations: int,
    source: str = "<replay>",
) -> Workload:
    """Iteration i = windows[i] (in that order), each group's measured lengths; the first `iterations`
    windows are used and every group in them must have been consumed (be in `lengths`)."""
    if iterations < 1:
        raise UserError("iterations must be >= 1")
    if len(windows) < iterations:
        raise UserError(f"{source}: {len(windows)} windows recorded, {iterations} iterations wanted")
    sizes = {len(v) for v in lengths.values()}
    if len(sizes) != 1:
        raise UserError(f"{source}: groups of different sizes {sorted(sizes)}")
    n = sizes.pop()
    keys: list[GroupKey] = []
    for i, win in enumerate(windows[:iterations]):
        if len(win) != prompts_per_iteration or len(set(win)) != len(win):
            raise UserError(
                f"{source}: window {i} holds {len(set(win))} distinct groups, "
                f"expected {prompts_per_iteration}"
            )
        keys.extend(win)
    missing = [k for k in keys if k not in lengths]
    if missing:
        raise UserError(
            f"{source}: group {missing[0][0]}@{missing[0][1]} was planned but never consumed "
            f"({len(missing)} such groups)"
        )
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise UserError(f"{source}: group {dup[0]}@{dup[1]} appears in two windows")
    if isinstance(prompt_len, int):
        pl = np.full(len(keys), prompt_len, dtype=np.int64)
    else:
        absent = sorted({k[0] for k in keys if k[0] not in prompt_len})
        if absent:
            raise UserError(f"{source}: no prompt length for prompt '{absent[0]}' ({len(absent)} prompts)")
        pl = np.array([int(prompt_len[k[0]]) for k in keys], dtype=np.int64)
    resp = np.stack([lengths[k] for k in keys]).astype(np.int64)
    g = len(keys)
    return Workload(
        group_size=n,
        prompts_per_iteration=prompts_per_iteration,
        prompt_ids=np.array([k[0] for k in keys]),
        epoch=np.array([k[1] for k in keys], dtype=np.int64),
        iteration=np.arange(g, dtype=np.int64) // prompts_per_iteration,
        prompt_len=np.maximum(pl, 1),
        response_len=np.maximum(resp, 1),  # a 0-token response still occupies a slot for one step
        source=source,
    )


def layout_for_run(s: RunSettings, sim_mode: str, cores: int) -> DeviceSplit:
    """The simulator layout of the run's devices (on CPU, a device is a core).

    Instances: `num_instances` x `infer_tp`; a colocated mode generates on every device
    (`core.modes.instances_on`) and trains on them. A disaggregated one gets the trainer the
    controller placed (`Controller._place`): `num_threads` per rank, or (cores - rollout cores) //
    ranks, at least one core per rank. When rollout and trainer do not fit in the cores they share
    them (oversubscribed); a calibration's core-sharing slowdowns model that (`sim.contention`).
    """
    if sim_mode not in SIM_SPECS:
        raise UserError(f"unknown simulator mode '{sim_mode}'")
    if SIM_SPECS[sim_mode].colocated_in_sim:
        instances = instances_on(s.instances, s.infer_tp, True, s.devices_per_node or cores)
        return DeviceSplit(instances * s.infer_tp, instances, s.infer_tp, instances * s.infer_tp)
    rollout = s.instances * s.infer_tp
    per_rank = s.trainer_threads or max(1, (cores - rollout) // max(1, s.trainer_world))
    trainer = s.trainer_world * per_rank
    return DeviceSplit(rollout + trainer, s.instances, s.infer_tp, trainer)


def trainer_cost_from_run(
    update_seconds: Sequence[float],
    lengths: Mapping[GroupKey, np.ndarray],
    prompt_len: Mapping[str, int] | int,
    trainer_devices: int,
) -> float:
    """Trainer device-seconds per sequence token (prompt + response; the simulator's
    `train_s_per_token`): the run's total measured update time x trainer devices / tokens consumed.
    With `trainer_devices` equal to the simulated layout's, one simulated rank reproduces the measured
    time for the run's mean token mix (the real trainer's own padding is inside the figure)."""
    tokens = 0
    for (pid, _), lens in lengths.items():
        p = prompt_len if isinstance(prompt_len, int) else int(prompt_len[pid])
        tokens += int(lens.sum()) + p * len(lens)
    total = float(sum(update_seconds))
    if tokens <= 0 or total <= 0:
        raise UserError("trainer cost: no consumed tokens or no measured timing/update in the run")
    return total * trainer_devices / tokens


def switch_costs_from_events(events: Mapping[str, Any]) -> tuple[float, float, int] | None:
    """Colocated runs: (rollout->train seconds, train->rollout seconds, windows measured) from events.json.

    rollout->train: from the end of a window's last unit to the trainer's first busy step after it;
    train->rollout: from the trainer's last busy end of window w-1 to the first unit start of window w
    (publish weights, wake engines, refresh, plan). Means over windows; None without the records.
    """
    units, trainer = events.get("units"), events.get("trainer")
    if not units or not trainer:
        return None
    span: dict[int, list[float]] = {}
    for u in units:
        m = re.match(r"w(\d+)/", str(u[1]))
        if m is None:
            continue
        w, t0, t1 = int(m.group(1)), float(u[2]), float(u[3])
        lo, hi = span.get(w, [t0, t1])
        span[w] = [min(lo, t0), max(hi, t1)]
    busy = [(float(a[0]), float(b[0])) for a, b in zip(trainer, trainer[1:], strict=False) if a[1] == "busy"]
    if not span or not busy:
        return None
    to_train, to_infer = [], []
    for w in sorted(span):
        start, end = span[w]
        after = [b0 for b0, _ in busy if b0 >= end]
        if after:
            to_train.append(after[0] - end)
        before = [b1 for _, b1 in busy if b1 <= start]
        if w > 0 and before:
            to_infer.append(start - before[-1])
    if not to_train:
        return None
    return float(np.mean(to_train)), float(np.mean(to_infer)) if to_infer else 0.0, len(to_train)


def preset_for_run(
    s: RunSettings,
    layout: DeviceSplit,
    calib: str | None,
    cost: Mapping[str, float] | None = None,
    base: str = "cpu",
) -> Preset:
    """`base` preset (its fallback costs, overlaid by `calib`) with the run's settings and `layout`;
    `cost` overrides cost fields (e.g. a trainer cost measured in the run) and wins over `calib`."""
    overrides: dict[str, Any] = {
        "cluster.devices": max(layout.devices, layout.instance_devices + 1),
        "cluster.infer_tp": s.infer_tp,
        "cluster.max_num_seqs": s.max_num_seqs,
        "cluster.min_trainer_devices": 1,
        "cluster.sweep_trainer_devices": 1,
        "cluster.split": "rule",
        "workload.prompts_per_iteration": s.prompts_per_iteration,
        "workload.n_samples_per_prompt": s.group_size,
        "workload.iterations": s.iterations,
        "workload.seed": s.data_seed,
        "rl.mini_batch_size": s.mini_batch_size,
        "rl.max_lag": s.max_lag,
        "rl.sync_every_minibatches": s.steps_per_version,
        "rl.predictor": s.predictor,
        "rl.executor": s.executor,
        "rl.plan_window": 1,
        "cost.micro_batch_size": s.micro_batch_size,
        "cost.train_dp_devices": max(1, layout.trainer_devices // max(1, s.trainer_dp)),
    }
    for k, v in (cost or {}).items():
        overrides[f"cost.{k}"] = v if isinstance(v, int) else float(v)  # int fields stay int
    return load_preset(base, calib=calib, overrides=overrides)
