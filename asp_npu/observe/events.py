"""The event log that bubble accounting and timelines read: produced by the simulator and the real pipeline.

Everything is a piecewise-constant state change, so a run of 100k sequences stays a few hundred
thousand small tuples (columnar lists, no per-event objects):

- `instance_state(t, i, running, state)` -- from `t` until instance i's next record, `running` of its
  `slots` sequence slots generate; the idle ones are idle for `state`'s reason:
  `run` (it has work; idle slots wait for the unit's stragglers), `blocked` (back-pressure: queue full
  or lag bound), `drained` (no work left in this iteration), `paused` (weight refresh / resharding /
  offload), `lent` (its devices run the trainer: colocated modes).
- `trainer_state(t, state, useful)` -- `busy` (a fraction `useful` of the device time does real
  tokens; the rest is padding), `wait` (no complete minibatch), `paused` (weight refresh or
  switching), `lent` (its devices run rollout: colocated modes).
- `queue(t, queued, in_flight)`, `unit(i, label, t0, t1, samples)`, `version(t, v)`,
  `iteration(t)` -- for timelines and metrics.

A colocated run registers the same physical devices as instances and as the trainer and keeps exactly
one side `lent` at any time; `bubbles.account` checks the device-seconds add up.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from asp_npu.errors import UserError

INSTANCE_STATES = ("run", "blocked", "drained", "paused", "lent")
TRAINER_STATES = ("busy", "wait", "paused", "lent")


@dataclass
class EventLog:
    """Columnar log of state changes (see module docstring). Times are seconds on any clock."""

    devices: int = 0  # physical devices of the whole job
    instance_devices: list[int] = field(default_factory=list)
    instance_slots: list[int] = field(default_factory=list)
    trainer_devices: int = 0
    colocated: bool = False
    inst: list[tuple[float, int, int, str]] = field(default_factory=list)
    trainer: list[tuple[float, str, float]] = field(default_factory=list)
    queue_occ: list[tuple[float, int, int]] = field(default_factory=list)
    units: list[tuple[int, str, float, float, int]] = field(default_factory=list)
    versions: list[tuple[float, int]] = field(default_factory=list)
    iterations: list[float] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def add_instance(self, devices: int, slots: int) -> int:
        self.instance_devices.append(int(devices))
        self.instance_slots.append(int(slots))
        return len(self.instance_devices) - 1

    def instance_state(self, t: float, i: int, running: int, state: str) -> None:
        self.inst.append((t, i, running, state))

    def trainer_state(self, t: float, state: str, useful: float = 1.0) -> None:
        self.trainer.append((t, state, useful))

    def queue(self, t: float, queued: int, in_flight: int) -> None:
        self.queue_occ.append((t, queued, in_flight))

    def unit(self, i: int, label: str, t0: float, t1: float, samples: int) -> None:
        self.units.append((i, label, t0, t1, samples))

    def version(self, t: float, v: int) -> None:
        self.versions.append((t, v))

    def iteration(self, t: float) -> None:
        self.iterations.append(t)

    @property
    def t_end(self) -> float:
        ends = [self.inst[-1][0] if self.inst else 0.0, self.trainer[-1][0] if self.trainer else 0.0]
        ends += [self.iterations[-1]] if self.iterations else []
        return max(ends)

    # ------------------------------------------------------------------------------ (de)serialise
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "asp-events/1",
            "devices": self.devices,
            "instance_devices": self.instance_devices,
            "instance_slots": self.instance_slots,
            "trainer_devices": self.trainer_devices,
            "colocated": self.colocated,
            "inst": self.inst,
            "trainer": self.trainer,
            "queue": self.queue_occ,
            "units": self.units,
            "versions": self.versions,
            "iterations": self.iterations,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "event log") -> EventLog:
        if d.get("schema") != "asp-events/1":
            raise UserError(f"{where}: not an asp-events/1 log (schema={d.get('schema')!r})")
        try:
            log = cls(
                devices=int(d["devices"]),
                instance_devices=[int(x) for x in d["instance_devices"]],
                instance_slots=[int(x) for x in d["instance_slots"]],
                trainer_devices=int(d["trainer_devices"]),
                colocated=bool(d["colocated"]),
                inst=[(float(t), int(i), int(r), str(s)) for t, i, r, s in d["inst"]],
                trainer=[(float(t), str(s), float(u)) for t, s, u in d["trainer"]],
                queue_occ=[(float(t), int(a), int(b)) for t, a, b in d.get("queue", [])],
                units=[
                    (int(i), str(lbl), float(a), float(b), int(n)) for i, lbl, a, b, n in d.get("units", [])
                ],
                versions=[(float(t), int(v)) for t, v in d.get("versions", [])],
                iterations=[float(t) for t in d.get("iterations", [])],
                meta=dict(d.get("meta", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{where}: malformed event log ({exc})") from None
        bad = [s for _, _, _, s in log.inst if s not in INSTANCE_STATES]
        bad += [s for _, s, _ in log.trainer if s not in TRAINER_STATES]
        if bad:
            raise UserError(f"{where}: unknown state {bad[0]!r}")
        return log

    def write(self, path: str | os.PathLike[str]) -> None:
        from asp_npu.io import atomic_write_json

        atomic_write_json(path, self.to_dict())

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> EventLog:
        try:
            with open(path, encoding="utf-8") as f:
                return cls.from_dict(json.load(f), where=str(path))
        except FileNotFoundError:
            raise UserError(f"{path}: no such file") from None
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: malformed JSON ({exc.msg})") from None
