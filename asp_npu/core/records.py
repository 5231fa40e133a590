"""The records that cross the layers: a group's identity, a dispatch unit, and the queue's messages.

One shape per thing, from the planner to the instance and the simulator:

- `GroupKey(prompt_id, epoch)`: one GRPO group of a run (the same prompt in two epochs is two groups).
  On the wire (Ray, `PromptItem.prompt_id`, `plans/*.json`) it is the string `<prompt_id>@<epoch>`;
  `str(key)` builds it and `GroupKey.parse` is the only place that splits it.
- `Unit`: what the planner hands a feed and a feed hands an instance (whole groups, in order).
- `Arrival`, `Minibatch`: the queue actor's messages to the driver (a finished group; a trainer step's
  complete minibatch).

Plain frozen dataclasses of Python scalars, tuples and lists: they pickle cheaply through Ray.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

K = TypeVar("K", bound=Hashable)  # a driver's group id: the pipeline's wire id, the simulator's index


class GroupKey(NamedTuple):
    """One GRPO group: a prompt in one epoch. A NamedTuple (immutable, hashable, ordered) so replay
    tables keyed by `(prompt_id, epoch)` tuples accept it unchanged."""

    prompt_id: str
    epoch: int

    def __str__(self) -> str:
        return f"{self.prompt_id}@{self.epoch}"

    @classmethod
    def parse(cls, gid: str) -> GroupKey:
        """`<prompt_id>@<epoch>` -> GroupKey (the prompt id may itself contain '@')."""
        base, sep, epoch = str(gid).rpartition("@")
        if not sep or not epoch.isdigit():
            raise ValueError(f"group id '{gid}' is not <prompt_id>@<epoch>")
        return cls(base, int(epoch))


@dataclass(frozen=True, eq=False)
class Unit(Generic[K]):
    """One dispatch unit of a planning window: whole groups an instance starts together (unit
    admission) or in order (continuous admission). Compared by identity: two units never alias.

    `groups` are the driver's group ids (the pipeline's wire ids, the simulator's group indices);
    `instance` is the planned instance under static dispatch, -1 when any instance may take it.
    """

    uid: int
    window: int
    groups: tuple[K, ...]
    group_size: int
    instance: int = -1
    predicted_tokens: float = 0.0  # planner's predicted response tokens of all its samples
    q90: float = 0.0  # longest predicted q90 among its groups (the stream dispatcher's weight)

    @property
    def samples(self) -> tuple[tuple[K, int], ...]:
        """(group id, sample index) of every sample, group-major (the order an instance starts them)."""
        return tuple((g, k) for g in self.groups for k in range(self.group_size))

    @property
    def num_samples(self) -> int:
        return len(self.groups) * self.group_size


@dataclass(frozen=True)
class Arrival:
    """A finished group put into the queue actor (one per group, in arrival order)."""

    group: str  # wire id `<prompt_id>@<epoch>`
    t: float
    instance: int
    samples: int
    tokens: int
    versions: tuple[int, ...]  # weights versions its samples started with
    lens: tuple[int, ...]  # response length of every sample
    prompt_len: int
    filtered: bool = False  # DAPO dynamic sampling discarded it (equal rewards): consumed, not trained
    # per sample, multi-turn: the model's own tokens (tool outputs excluded), assistant turns, tool-wait s
    model_lens: tuple[int, ...] = ()
    turns: tuple[int, ...] = ()
    tool_s: tuple[float, ...] = ()

    @property
    def key(self) -> GroupKey:
        return GroupKey.parse(self.group)


@dataclass(frozen=True)
class Minibatch:
    """The queue actor's answer to `get_batch`: one trainer step's complete minibatch."""

    step: int  # lag-ledger step it is handed out for
    t: float
    groups: tuple[Hashable, ...]  # group ids as the TrainQueue keys them
    lags: tuple[int, ...]  # per group, by admitted version
    queued_before: int  # groups queued when it was taken (occupancy metric)
    trajectories: list[Any] = field(default_factory=list, compare=False)  # list[asp_npu.types.Trajectory]

    def row(self) -> dict[str, Any]:
        """What the queue keeps of a handout (no payload)."""
        return {"step": self.step, "t": self.t, "groups": list(self.groups),
                "queued_before": self.queued_before, "lags": list(self.lags)}
