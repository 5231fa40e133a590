"""Simulator presets: YAML files under configs/sim/ (or any path), validated into a `Preset`.

A preset names the cluster (devices, inference TP, slots), the workload (a trace file or the
synthetic generator's knobs), the RL batch shape (prompts per iteration, samples per prompt,
minibatch, lag bound) and the cost numbers. Every number's public source is in docs/simulator.md
and, briefly, in the YAML's `sources:` map. The `cpu` preset reads a calibration file written by
`asp-npu calibrate` (`cost_from: calib.json`); fields that are null there fall back to the preset's
own numbers, and the preset records which ones it used (`Preset.notes`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from asp_npu.errors import InvalidValue, UserError
from asp_npu.io import read_json_file, read_text_file
from asp_npu.sim.calibrate import SCHEMA as CALIB_SCHEMA
from asp_npu.sim.cost import SimCost
from asp_npu.validation import INT32_MAX, check_float, check_int

PRESET_DIR = Path(__file__).resolve().parents[2] / "configs" / "sim"


@dataclass(frozen=True)
class Cluster:
    devices: int = 32  # physical accelerators of the job
    infer_tp: int = 2  # devices per rollout instance
    max_num_seqs: int = 256  # concurrent sequence slots per instance
    min_trainer_devices: int = 8  # smallest trainer that holds the model + optimizer (disaggregated)
    sweep_trainer_devices: int = 16  # trainer size held fixed in the --instances sweep
    split: str = "rule"  # disaggregated device split: rule (balance predicted stages) | search (simulate all)
    # the trainer's legal parallel shapes, "TPxPP" each (those `asp-npu check` fits in memory); a split's
    # trainer is then DP copies of one shape, DP dividing the minibatch's micro-batches (megatron), and a
    # pipeline pays its stage imbalance (most layers of a stage over the mean, `trainer_layers`) and its
    # 1F1B bubble. None: any whole number of `cost.train_dp_devices`-device ranks, nothing charged.
    trainer_shapes: list[str] | None = None
    trainer_layers: int = 0  # the model's transformer layers (trainer_shapes' stage imbalance)


@dataclass(frozen=True)
class WorkloadSpec:
    prompts_per_iteration: int = 128  # global batch in prompts (GRPO groups)
    n_samples_per_prompt: int = 8
    iterations: int = 50
    trace: str | None = None  # JSONL trace; None -> synthetic generator with `synth`
    synth: dict[str, Any] = field(default_factory=dict)  # asp_npu.data.traces.SynthParams fields
    # multi-turn tool-calling trajectories: asp_npu.data.traces.MultiTurnParams fields (instead of synth)
    multi_turn: dict[str, Any] = field(default_factory=dict)
    seed: int = 0  # data-loader shuffle


@dataclass(frozen=True)
class RLSpec:
    mini_batch_size: int = 256  # samples per trainer step in the asynchronous modes
    max_lag: int = 2  # policy-lag bound (weight versions) of the asynchronous modes
    sync_every_minibatches: int = 1  # trainer steps per weight refresh (verl trigger_parameter_sync_step)
    predictor: str = "history"  # ASP's length predictor
    # how ASP's architecture (asp and async-fifo alike) runs dispatch units on an instance:
    # stream = submitted ahead into vLLM's queue, filling slots as they free (continuous batching);
    # unit = one blocking generate call per unit, the next unit when it has ended (MindSpeed-RL style)
    executor: str = "stream"
    plan_window: int = 1  # iterations ASP plans together (one offline pass per window)
    # partial rollout (docs/simulator.md): in-flight groups count their lag from the newest weights;
    # every token's lag stays within max_token_lag (None: 4 x the mode's max_lag)
    partial_rollout: bool = False
    max_token_lag: int | None = None
    # "" = asp splits its devices like every disaggregated mode (cluster.split; the sweep's fixed trainer) |
    # auto: asp simulates every split of the same devices and keeps its best (rl_config.layout: auto)
    layout: str = ""


@dataclass
class Preset:
    name: str
    cluster: Cluster
    workload: WorkloadSpec
    rl: RLSpec
    cost: SimCost
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    path: str = ""

    def describe(self) -> dict[str, Any]:

        return {
            "name": self.name,
            "path": self.path,
            "cluster": asdict(self.cluster),
            "workload": _workload_dict(self.workload),
            "rl": asdict(self.rl),
            "cost": asdict(self.cost),
            "notes": list(self.notes),
        }


def _workload_dict(w: WorkloadSpec) -> dict[str, Any]:
    """The workload as a mapping; `multi_turn` only when set (single-turn reports stay as they were)."""
    d = asdict(w)
    if not d["multi_turn"]:
        del d["multi_turn"]
    return d


def _build(cls: type, data: Any, where: str) -> Any:
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise UserError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(known)})")
    out = {}
    for k, v in data.items():
        default = getattr(cls(), k)
        if isinstance(default, bool) or v is None or isinstance(default, dict) or default is None:
            out[k] = v
        elif isinstance(default, int) and not isinstance(v, bool) and isinstance(v, int):
            out[k] = v
        elif isinstance(default, float) and not isinstance(v, bool) and isinstance(v, (int, float)):
            out[k] = float(v)
        elif isinstance(default, str) and isinstance(v, str):
            out[k] = v
        else:
            raise UserError(f"{where}.{k}: expected {type(default).__name__}, got {v!r}")
    return cls(**out)


def resolve_path(name_or_path: str) -> Path:
    """A preset name (configs/sim/<name>.yaml) or a path to a YAML file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        if not p.is_file():
            raise UserError(f"{name_or_path}: preset file not found")
        return p
    q = PRESET_DIR / f"{name_or_path}.yaml"
    if not q.is_file():
        have = ", ".join(sorted(x.stem for x in PRESET_DIR.glob("*.yaml")))
        raise UserError(f"unknown preset '{name_or_path}' (have: {have}; or give a path to a YAML file)")
    return q


def _read_preset_file(path: Path) -> dict[str, Any]:
    """The preset file's top-level mapping, its keys checked (one line naming the first problem)."""
    import yaml

    try:
        data = yaml.safe_load(read_text_file(path, "preset YAML"))
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: invalid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping at the top level")
    allowed = {"name", "description", "cluster", "workload", "rl", "cost", "cost_from", "sources"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise UserError(f"{path}: unknown key '{unknown[0]}' (known: {', '.join(sorted(allowed))})")
    if not isinstance(data.get("sources") or {}, dict):
        raise UserError(f"{path}: sources: expected a mapping, got {type(data['sources']).__name__}")
    return data


def load_preset(
    name_or_path: str,
    iterations: int | None = None,
    trace: str | None = None,
    calib: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> Preset:
    """Load and validate a preset; `iterations` / `trace` / `calib` override the file (CLI flags).

    A relative `cost_from` is looked up in the working directory first, then next to the preset.
    """
    path = resolve_path(name_or_path)
    data = _read_preset_file(path)
    cluster = _build(Cluster, data.get("cluster"), f"{path}: cluster")
    workload = _build(WorkloadSpec, data.get("workload"), f"{path}: workload")
    if workload.trace is not None and not isinstance(workload.trace, str):
        raise UserError(f"{path}: workload.trace must be a file path (got {workload.trace!r})")
    rl = _build(RLSpec, data.get("rl"), f"{path}: rl")
    cost = _build(SimCost, data.get("cost"), f"{path}: cost")
    notes: list[str] = []
    source = calib or data.get("cost_from")
    if source:
        cpath = Path(str(source))
        if not cpath.is_absolute() and not cpath.exists() and (path.parent / cpath).exists():
            cpath = path.parent / cpath
        cost, notes = apply_calibration(cost, cpath)
    if overrides:
        cluster, workload, rl, cost = _override(overrides, cluster, workload, rl, cost)
    if iterations is not None:
        workload = replace(workload, iterations=iterations)
    if trace is not None:
        workload = replace(workload, trace=trace)
    elif workload.trace and not Path(workload.trace).is_absolute():
        rel = path.parent / workload.trace
        if rel.exists():
            workload = replace(workload, trace=str(rel))
    preset = Preset(
        str(data.get("name", path.stem)),
        cluster,
        workload,
        rl,
        cost,
        {str(k): str(v) for k, v in (data.get("sources") or {}).items()},
        notes,
        str(path),
    )
    problems = validate(preset)
    if problems:
        raise UserError(f"{path}: " + "; ".join(problems))
    return preset


def _override(overrides: dict[str, Any], *sections: Any) -> tuple[Any, ...]:
    """Apply `section.key: value` overrides (a bare key means `rl.key`) with the preset's type checks."""
    names = ("cluster", "workload", "rl", "cost")
    per: dict[str, dict[str, Any]] = {n: {} for n in names}
    for key, value in overrides.items():
        sec, _, k = key.rpartition(".")
        sec = sec or "rl"
        if sec not in per:
            raise UserError(f"--set {key}: section must be one of {', '.join(names)}")
        per[sec][k] = value
    return tuple(
        _build(type(obj), {**asdict(obj), **per[n]}, f"--set {n}") if per[n] else obj
        for n, obj in zip(names, sections, strict=True)
    )


def _number_problems(section: str, obj: Any) -> list[str]:
    """Every number of a section finite, non-negative and within int32 / 1e9 (NaN, inf refused)."""
    bad = []
    for f in fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        try:
            if isinstance(v, int):
                check_int(f"{section}.{f.name}", v, 0, INT32_MAX)
            else:
                check_float(f"{section}.{f.name}", v, 0.0, 1e9)
        except InvalidValue as exc:
            bad.append(str(exc))
    return bad


def _workload_problems(w: WorkloadSpec) -> list[str]:
    if w.trace is not None and not isinstance(w.trace, str):
        return [f"workload.trace must be a file path (got {w.trace!r})"]
    if not isinstance(w.synth, dict):
        return [f"workload.synth must be a mapping of generator knobs (got {w.synth!r})"]
    from asp_npu.data.traces import MultiTurnParams, SynthParams

    if not isinstance(w.multi_turn, dict):
        return [f"workload.multi_turn must be a mapping of generator knobs (got {w.multi_turn!r})"]
    if w.multi_turn:
        if w.synth or w.trace is not None:
            return ["workload.multi_turn generates the trajectories: leave out workload.synth and .trace"]
        mknown = {f.name for f in fields(MultiTurnParams)}
        bad = sorted(set(w.multi_turn) - mknown)
        if bad:
            return [f"workload.multi_turn: unknown key '{bad[0]}' (known: {', '.join(sorted(mknown))})"]
        try:
            MultiTurnParams(**{"n": w.n_samples_per_prompt, **w.multi_turn}).validate()
        except (UserError, TypeError) as exc:
            return [f"workload.multi_turn: {exc}"]
        return []
    known = {f.name for f in fields(SynthParams)}
    unknown = sorted(set(w.synth) - known)
    if unknown:
        return [f"workload.synth: unknown key '{unknown[0]}' (known: {', '.join(sorted(known))})"]
    try:
        SynthParams(**{"n": w.n_samples_per_prompt, **w.synth}).validate()
    except UserError as exc:
        return [f"workload.synth: {exc}"]
    return []


def parse_shapes(shapes: list[str] | None) -> list[tuple[int, int]]:
    """`cluster.trainer_shapes` as (TP, PP) pairs (validated by `trainer_shape_problems`)."""
    out = []
    for x in shapes or []:
        tp, pp = str(x).lower().split("x")
        out.append((int(tp), int(pp)))
    return out


def trainer_shape_problems(c: Cluster) -> list[str]:
    if c.trainer_shapes is None:
        return []
    if not isinstance(c.trainer_shapes, list) or not c.trainer_shapes:
        return [f"cluster.trainer_shapes: expected a non-empty list of 'TPxPP' (got {c.trainer_shapes!r})"]
    for x in c.trainer_shapes:
        parts = str(x).lower().split("x")
        if len(parts) != 2 or not all(q.isdigit() and int(q) >= 1 for q in parts):
            return [f"cluster.trainer_shapes: '{x}' is not TPxPP with TP, PP >= 1 (e.g. 4x1, 2x7)"]
    if c.trainer_layers < 1:
        return [f"cluster.trainer_layers must be >= 1 with trainer_shapes (got {c.trainer_layers})"]
    return []


def validate(p: Preset) -> list[str]:
    """Every problem of a preset, one line each (numbers first: the rest assumes they are numbers)."""
    bad = [x for sec in ("cluster", "workload", "rl", "cost") for x in _number_problems(sec, getattr(p, sec))]
    if bad:
        return bad
    return (list(p.cost.validate()) + _workload_problems(p.workload) + _cluster_problems(p.cluster)
            + _shape_problems(p.workload, p.rl) + _rl_problems(p.rl)
            + ([f"workload.trace: {p.workload.trace} not found"]
               if isinstance(p.workload.trace, str) and not Path(p.workload.trace).is_file() else []))


def _cluster_problems(c: Cluster) -> list[str]:
    bad = [f"cluster.{name} must be >= 1 (got {getattr(c, name)})"
           for name in ("devices", "infer_tp", "max_num_seqs", "min_trainer_devices", "sweep_trainer_devices")
           if getattr(c, name) < 1]
    if c.split not in ("rule", "search"):
        bad.append(f"cluster.split must be rule|search (got {c.split!r})")
    bad += trainer_shape_problems(c)
    if c.devices < c.infer_tp + c.min_trainer_devices:
        bad.append(
            f"cluster.devices ({c.devices}) cannot hold one instance (infer_tp={c.infer_tp}) and "
            f"a trainer of min_trainer_devices={c.min_trainer_devices}"
        )
    return bad


def _shape_problems(w: WorkloadSpec, r: RLSpec) -> list[str]:
    """Whole groups per minibatch, whole minibatches (and refresh intervals) per iteration."""
    counts = ("prompts_per_iteration", "n_samples_per_prompt", "iterations")
    bad = [f"workload.{k} must be >= 1 (got {getattr(w, k)})" for k in counts if getattr(w, k) < 1]
    n = w.n_samples_per_prompt
    if r.mini_batch_size < n or r.mini_batch_size % n:
        bad.append(f"rl.mini_batch_size ({r.mini_batch_size}) must hold whole groups of {n}")
    elif (w.prompts_per_iteration * n) % r.mini_batch_size:
        bad.append(
            f"rl.mini_batch_size ({r.mini_batch_size}) must divide the iteration "
            f"({w.prompts_per_iteration} x {n} samples)"
        )
    if r.sync_every_minibatches < 1:
        bad.append(f"rl.sync_every_minibatches must be >= 1 (got {r.sync_every_minibatches})")
    elif (
        r.mini_batch_size >= n
        and not r.mini_batch_size % n
        and (w.prompts_per_iteration * n) % (r.mini_batch_size * r.sync_every_minibatches)
    ):
        bad.append("rl.mini_batch_size x rl.sync_every_minibatches must divide the iteration")
    return bad


def _rl_problems(r: RLSpec) -> list[str]:
    bad = []
    if r.max_lag < 0:
        bad.append(f"rl.max_lag must be >= 0 (got {r.max_lag})")
    if not isinstance(r.partial_rollout, bool):
        bad.append(f"rl.partial_rollout must be true|false (got {r.partial_rollout!r})")
    tl = r.max_token_lag
    if tl is not None and (isinstance(tl, bool) or not isinstance(tl, int)):
        bad.append(f"rl.max_token_lag must be an integer (got {r.max_token_lag!r})")
    elif r.max_token_lag is not None and r.max_token_lag < r.max_lag:
        bad.append(f"rl.max_token_lag ({r.max_token_lag}) must be >= rl.max_lag ({r.max_lag})")
    if r.plan_window < 1:
        bad.append(f"rl.plan_window must be >= 1 (got {r.plan_window})")
    if r.layout not in ("", "auto"):
        bad.append(f"rl.layout must be auto or empty (got {r.layout!r})")
    if r.executor not in ("stream", "unit"):
        bad.append(f"rl.executor must be stream|unit (got {r.executor!r})")
    if r.predictor not in ("history", "prompt-len", "oracle"):
        bad.append(f"rl.predictor must be history|prompt-len|oracle (got {r.predictor!r})")
    return bad


def read_calibration(path: Path) -> dict[str, Any]:
    """An `asp-calib/1` file's object (`asp-npu calibrate --out`); one line if missing or not one."""
    if not path.exists():
        raise UserError(f"{path}: calibration file not found (run `asp-npu calibrate --out {path}` first)")
    d = read_json_file(path, "calibration file")
    if not isinstance(d, dict) or d.get("schema") != CALIB_SCHEMA:
        raise UserError(f"{path}: not an {CALIB_SCHEMA} calibration file")
    return d


def apply_calibration(cost: SimCost, path: Path) -> tuple[SimCost, list[str]]:
    """Overlay an `asp-calib/1` file on `cost`; null fields keep the preset's default (and say so)."""
    d = read_calibration(path)
    notes = [f"calibration: {path} (model {d.get('model', '?')})"]
    upd: dict[str, Any] = {}
    step = d.get("decode_step_s") or {}
    if not isinstance(step, dict):
        raise UserError(f"{path}: decode_step_s must be an object")
    for key, attr in (("a", "decode_a"), ("b_per_seq", "decode_b"), ("c_per_kv_token", "decode_c")):
        _take(step.get(key), attr, f"decode_step_s.{key}", upd, notes, cost, path)
    _take(d.get("prefill_s_per_token"), "prefill_s_per_token", "prefill_s_per_token", upd, notes, cost, path)
    _take(d.get("refresh_s"), "refresh_s", "refresh_s", upd, notes, cost, path)
    _take(d.get("trainer_s_per_token"), "train_s_per_token", "trainer_s_per_token", upd, notes, cost, path)
    if d.get("trainer_step_s") is not None:  # calibrations before the fixed part was measured: none
        _take(d.get("trainer_step_s"), "train_step_s", "trainer_step_s", upd, notes, cost, path)
    share = d.get("core_sharing") or {}
    if not isinstance(share, dict):
        raise UserError(f"{path}: core_sharing must be an object")
    pairs = (("decode_slowdown", "share_decode_slowdown"), ("train_slowdown", "share_train_slowdown"),
             ("colocated_decode_slowdown", "colocated_decode_slowdown"))
    for key, attr in pairs:
        if share.get(key) is not None:
            try:
                upd[attr] = check_float(f"{path}: core_sharing.{key}", share[key], 1.0, 1e3)
            except InvalidValue as exc:
                raise UserError(str(exc)) from None
    return replace(cost, **upd), notes


def _take(v: Any, attr: str, key: str, upd: dict, notes: list[str], cost: SimCost, path: Path) -> None:
    if v is None:
        notes.append(f"{key}: not measured in {path.name}; preset default {getattr(cost, attr)} used")
        return
    try:
        upd[attr] = check_float(f"{path}: {key}", v, 0.0, 1e9)
    except InvalidValue as exc:
        raise UserError(str(exc)) from None
