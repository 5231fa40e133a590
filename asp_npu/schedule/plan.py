"""Plan types: the planner's input (`Groups`) and output (`RolloutPlan` of `DispatchUnit`s), `asp-plan/1`.

Both are columnar (numpy) because plans reach a million samples; `DispatchUnit` objects are built
only when a consumer asks for them (`RolloutPlan.instances`). The JSON form is the file contract of
ARCHITECTURE.md section 3 and is written streaming, unit by unit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from asp_npu.data.traces import json_escaped
from asp_npu.errors import UserError
from asp_npu.io import atomic_write, check_readable, check_writable, loads_strict
from asp_npu.types import LengthEstimate

SCHEMA = "asp-plan/1"


@dataclass
class Groups:
    """GRPO groups to plan, one row each, all of the same size, with their predicted lengths."""

    prompt_ids: np.ndarray  # (g,) str
    sample_idxs: np.ndarray  # (g, n) int64
    mean: np.ndarray  # (g,) float64 predicted tokens per sample
    q50: np.ndarray
    q90: np.ndarray
    prompt_lens: np.ndarray | None = None  # (g,) int64, only used by a cost model with c > 0

    def __post_init__(self) -> None:
        self.prompt_ids = np.asarray(self.prompt_ids).astype(str)
        self.sample_idxs = np.asarray(self.sample_idxs, dtype=np.int64)
        if self.sample_idxs.ndim != 2:
            raise ValueError("sample_idxs must be a (groups, group_size) matrix")
        g = self.prompt_ids.shape[0]
        for name in ("mean", "q50", "q90"):
            arr = np.asarray(getattr(self, name), dtype=np.float64)
            if arr.shape != (g,):
                raise ValueError(f"{name} must have shape ({g},), got {arr.shape}")
            if g and not np.all(np.isfinite(arr) & (arr > 0)):
                raise ValueError(f"{name}: predicted lengths must be finite and > 0")
            setattr(self, name, arr)
        if self.sample_idxs.shape[0] != g:
            raise ValueError("sample_idxs has a different number of groups than prompt_ids")
        if self.prompt_lens is not None:
            self.prompt_lens = np.asarray(self.prompt_lens, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def group_size(self) -> int:
        return int(self.sample_idxs.shape[1])

    @property
    def num_samples(self) -> int:
        return int(self.sample_idxs.size)

    @classmethod
    def from_estimates(cls, items: Sequence[tuple[str, Sequence[int], LengthEstimate]]) -> Groups:
        """From `(prompt_id, sample_idxs, LengthEstimate)` per group (all groups the same size)."""
        sizes = {len(s) for _, s, _ in items}
        if len(sizes) > 1:
            raise ValueError(f"groups differ in size: {sorted(sizes)}")
        n = sizes.pop() if sizes else 1
        return cls(
            np.array([p for p, _, _ in items], dtype=str),
            np.array([list(s) for _, s, _ in items], dtype=np.int64).reshape(len(items), n),
            np.array([e.mean for _, _, e in items], dtype=np.float64),
            np.array([e.q50 for _, _, e in items], dtype=np.float64),
            np.array([e.q90 for _, _, e in items], dtype=np.float64),
        )


class PlannedSample(NamedTuple):
    prompt_id: str
    sample_idx: int
    predicted_len: int


@dataclass
class DispatchUnit:
    """A generation minibatch: whole GRPO groups, run as one batch on one instance."""

    unit: int
    instance: int
    target_step: int  # trainer step (minibatch) its samples are planned to feed
    predicted_start: float
    predicted_finish: float
    samples: list[PlannedSample] = field(default_factory=list)

    @property
    def prompt_ids(self) -> list[str]:
        """The groups it holds, in order (each prompt id once)."""
        return list(dict.fromkeys(s.prompt_id for s in self.samples))

    @property
    def predicted_tokens(self) -> int:
        return sum(s.predicted_len for s in self.samples)


@dataclass
class RolloutPlan:
    """Per instance an ordered list of units, plus the planner's predictions, in columnar form.

    Samples are stored in unit-id order: unit u owns rows `unit_offsets[u]:unit_offsets[u+1]`.
    Unit ids follow planned start time, so they are also a valid global dispatch order.
    """

    group_prompt_ids: np.ndarray  # (g,) str
    sample_group: np.ndarray  # (s,) int64 index into group_prompt_ids
    sample_idx: np.ndarray  # (s,) int64
    sample_predicted_len: np.ndarray  # (s,) int64
    unit_offsets: np.ndarray  # (u+1,) int64
    unit_instance: np.ndarray  # (u,) int64
    unit_start: np.ndarray  # (u,) float64 predicted seconds from plan start
    unit_finish: np.ndarray  # (u,) float64
    unit_target_step: np.ndarray  # (u,) int64
    num_instances: int
    trainer_step_end: np.ndarray = field(default_factory=lambda: np.zeros(0))  # planned step end times
    summary: dict[str, Any] = field(default_factory=dict)
    _instances: list[list[DispatchUnit]] | None = field(default=None, repr=False)

    @property
    def num_units(self) -> int:
        return int(self.unit_instance.shape[0])

    @property
    def num_samples(self) -> int:
        return int(self.sample_idx.shape[0])

    @property
    def sample_prompt_ids(self) -> np.ndarray:
        ids: np.ndarray = self.group_prompt_ids[self.sample_group]
        return ids

    @property
    def unit_sizes(self) -> np.ndarray:
        return np.diff(self.unit_offsets)

    @property
    def sample_unit(self) -> np.ndarray:
        return np.repeat(np.arange(self.num_units), self.unit_sizes)

    @property
    def instance_units(self) -> list[np.ndarray]:
        """Unit ids of each instance in execution order (planned start, then unit id)."""
        ids = np.lexsort((np.arange(self.num_units), self.unit_start, self.unit_instance))
        bounds = np.searchsorted(self.unit_instance[ids], np.arange(self.num_instances + 1))
        return [ids[bounds[k] : bounds[k + 1]] for k in range(self.num_instances)]

    def unit(self, u: int) -> DispatchUnit:
        lo, hi = int(self.unit_offsets[u]), int(self.unit_offsets[u + 1])
        pids = self.group_prompt_ids[self.sample_group[lo:hi]].tolist()
        samples = [
            PlannedSample(p, s, n)
            for p, s, n in zip(
                pids, self.sample_idx[lo:hi].tolist(), self.sample_predicted_len[lo:hi].tolist(), strict=True
            )
        ]
        return DispatchUnit(
            u,
            int(self.unit_instance[u]),
            int(self.unit_target_step[u]),
            float(self.unit_start[u]),
            float(self.unit_finish[u]),
            samples,
        )

    @property
    def instances(self) -> list[list[DispatchUnit]]:
        if self._instances is None:
            self._instances = [[self.unit(int(u)) for u in ids] for ids in self.instance_units]
        return self._instances

    # ------------------------------------------------------------------------------------- JSON
    def _json_chunks(self) -> Iterator[str]:
        pid = json_escaped(self.group_prompt_ids)
        yield f'{{"schema": "{SCHEMA}", "instances": ['
        for k, ids in enumerate(self.instance_units):
            yield ("" if k == 0 else ", ") + f'{{"instance": {k}, "units": ['
            for j, u in enumerate(ids.tolist()):
                lo, hi = int(self.unit_offsets[u]), int(self.unit_offsets[u + 1])
                body = ", ".join(
                    f'{{"prompt_id": "{p}", "sample_idx": {s}, "predicted_len": {n}}}'
                    for p, s, n in zip(
                        pid[self.sample_group[lo:hi]].tolist(),
                        self.sample_idx[lo:hi].tolist(),
                        self.sample_predicted_len[lo:hi].tolist(),
                        strict=True,
                    )
                )
                yield (
                    ("" if j == 0 else ", ")
                    + f'{{"unit": {u}, "target_step": {int(self.unit_target_step[u])}, '
                    f'"predicted_start": {float(self.unit_start[u]):.6g}, '
                    f'"predicted_finish": {float(self.unit_finish[u]):.6g}, "samples": [{body}]}}'
                )
            yield "]}"
        ends = ", ".join(f"{e:.6g}" for e in np.asarray(self.trainer_step_end).tolist())
        summary = json.dumps(self.summary, allow_nan=False)
        yield f'], "trainer": {{"step_end": [{ends}]}}, "summary": {summary}}}\n'

    def to_json(self) -> str:
        return "".join(self._json_chunks())

    def write_json(self, path: str | os.PathLike[str]) -> Path:
        """Atomic: readers see the old file or the whole plan, never half of it. Times must be finite
        (JSON has no Infinity; `PlannerConfig.validate` keeps every input finite)."""
        check_writable(path)
        times = (self.unit_start, self.unit_finish, np.asarray(self.trainer_step_end, dtype=np.float64))
        if not all(np.all(np.isfinite(t)) for t in times):
            raise ValueError("plan holds non-finite times; refusing to write invalid JSON")
        return atomic_write(path, self.to_json())

    @classmethod
    def from_json(cls, text: str | bytes) -> RolloutPlan:
        try:
            obj = loads_strict(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"plan is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        except ValueError as exc:  # undecodable bytes, NaN/Infinity literals
            raise UserError(f"plan is not valid JSON ({str(exc).splitlines()[0][:120]})") from None
        if not isinstance(obj, dict) or obj.get("schema") != SCHEMA:
            raise UserError(
                f"plan schema is {obj.get('schema') if isinstance(obj, dict) else None!r}, "
                f"expected {SCHEMA!r}"
            )
        names: dict[str, int] = {}
        sg, si, sp, offsets = [], [], [], [0]
        uid, uinst, ustart, ufin, ustep = [], [], [], [], []
        try:
            for inst in obj["instances"]:
                for unit in inst["units"]:
                    uid.append(int(unit["unit"]))
                    uinst.append(int(inst["instance"]))
                    ustart.append(float(unit.get("predicted_start", 0.0)))
                    ufin.append(float(unit.get("predicted_finish", 0.0)))
                    ustep.append(int(unit.get("target_step", -1)))
                    for s in unit["samples"]:
                        sg.append(names.setdefault(str(s["prompt_id"]), len(names)))
                        si.append(int(s["sample_idx"]))
                        sp.append(int(s["predicted_len"]))
                    offsets.append(len(si))
            summary = obj.get("summary", {})
            n_inst = int(summary.get("instances", max(uinst, default=-1) + 1))
            step_end = np.asarray(obj.get("trainer", {}).get("step_end", []), dtype=np.float64)
            summary = dict(summary)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise UserError(f"plan does not follow {SCHEMA}: {exc!r}") from None
        # store units in unit-id order
        ids = np.asarray(uid, dtype=np.int64)
        order = np.argsort(ids, kind="stable")
        if ids.size and not np.array_equal(ids[order], np.arange(ids.size)):
            raise UserError(f"plan unit ids are not 0..{ids.size - 1}")
        off = np.asarray(offsets, dtype=np.int64)
        sizes = np.diff(off)[order]
        rows = (
            np.concatenate([np.arange(off[u], off[u + 1]) for u in order])
            if ids.size
            else np.array([], np.int64)
        )
        return cls(
            np.array(list(names), dtype=str),
            np.asarray(sg, dtype=np.int64)[rows],
            np.asarray(si, dtype=np.int64)[rows],
            np.asarray(sp, dtype=np.int64)[rows],
            np.r_[0, np.cumsum(sizes)].astype(np.int64),
            np.asarray(uinst, dtype=np.int64)[order],
            np.asarray(ustart, dtype=np.float64)[order],
            np.asarray(ufin, dtype=np.float64)[order],
            np.asarray(ustep, dtype=np.int64)[order],
            n_inst,
            step_end,
            summary,
        )

    @classmethod
    def read_json(cls, path: str | os.PathLike[str]) -> RolloutPlan:
        p = check_readable(path, "plan file")
        try:
            return cls.from_json(p.read_bytes())
        except UserError as exc:
            raise UserError(f"{p}: {exc}") from None
