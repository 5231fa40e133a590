"""The prompts every mode sees: a trace cut into iterations (global batches) of whole GRPO groups.

Epochs are taken in order; inside an epoch the prompts are shuffled with a fixed seed (the data
loader's shuffle in verl / MindSpeed-RL) and cut into batches of `prompts_per_iteration`, dropping
the incomplete last batch (`drop_last`). A trace with too few epochs is reused from its first epoch
(the epoch label keeps counting, so a history predictor sees a longer run of the same prompts).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from asp_npu.data.traces import Trace, Turns, group_table
from asp_npu.errors import UserError


@dataclass
class Workload:
    """Group-major arrays over all simulated iterations (group g = row g)."""

    group_size: int
    prompts_per_iteration: int
    prompt_ids: np.ndarray  # (G,) str
    epoch: np.ndarray  # (G,) int64 epoch label
    iteration: np.ndarray  # (G,) int64
    prompt_len: np.ndarray  # (G,) int64 (one prompt, shared by its samples)
    response_len: np.ndarray  # (G, n) int64 (multi-turn: the model tokens of all turns)
    source: str = "<memory>"
    turns: Turns | None = None  # multi-turn: sample g * n + j's turns; None = one turn each

    @property
    def multi_turn(self) -> bool:
        return self.turns is not None

    @property
    def tool_len(self) -> np.ndarray:
        """(G, n) tool-output tokens of each sample (context the trainer reads; zeros single-turn)."""
        if self.turns is None:
            return np.zeros_like(self.response_len)
        return self.turns.per_row(self.turns.tool_tokens).reshape(self.response_len.shape)

    @property
    def tool_seconds(self) -> np.ndarray:
        """(G, n) seconds each sample waits on its tools (zeros single-turn)."""
        if self.turns is None:
            return np.zeros(self.response_len.shape)
        return self.turns.per_row(self.turns.tool_s).reshape(self.response_len.shape)

    @property
    def num_groups(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def num_iterations(self) -> int:
        return int(self.iteration.max()) + 1 if self.num_groups else 0

    @property
    def total_response_tokens(self) -> int:
        return int(self.response_len.sum())

    def iteration_groups(self, it: int) -> np.ndarray:
        lo = it * self.prompts_per_iteration
        return np.arange(lo, lo + self.prompts_per_iteration)


def from_trace(trace: Trace, prompts_per_iteration: int, iterations: int, seed: int = 0) -> Workload:
    """Cut `trace` into `iterations` batches of `prompts_per_iteration` groups (see module docstring)."""
    if prompts_per_iteration < 1 or iterations < 1:
        raise UserError("prompts_per_iteration and iterations must be >= 1")
    epochs = [int(e) for e in trace.epochs]
    per_epoch = []
    for e in epochs:
        codes, rows, n = group_table(trace.epoch_rows(e))
        per_epoch.append((codes, rows, n))
    sizes = {n for _, _, n in per_epoch}
    if len(sizes) != 1:
        raise UserError(f"{trace.source}: epochs have different group sizes {sorted(sizes)}")
    n = sizes.pop()
    usable = [len(c) // prompts_per_iteration for c, _, _ in per_epoch]
    if max(usable) == 0:
        raise UserError(
            f"{trace.source}: no epoch has {prompts_per_iteration} prompts for one iteration "
            f"(largest epoch has {max(len(c) for c, _, _ in per_epoch)})"
        )
    rng = np.random.default_rng(seed)
    ids, ep, pl, rl = [], [], [], []
    tparts: list[Turns] = []
    label = 0
    made = 0
    while made < iterations:
        codes, rows, _ = per_epoch[label % len(per_epoch)]
        sub = trace.epoch_rows(epochs[label % len(per_epoch)])
        order = rng.permutation(len(codes))
        take = min(usable[label % len(per_epoch)], iterations - made) * prompts_per_iteration
        pick = order[:take]
        ids.append(trace.prompt_names[codes[pick]])
        ep.append(np.full(take, label, dtype=np.int64))
        pl.append(sub.prompt_len[rows[pick, 0]])
        rl.append(sub.response_len[rows[pick]])
        if sub.turns is not None:
            tparts.append(sub.turns.take(rows[pick].ravel()))
        made += take // prompts_per_iteration
        label += 1
    g = sum(len(x) for x in ids)
    return Workload(
        group_size=n,
        prompts_per_iteration=prompts_per_iteration,
        prompt_ids=np.concatenate(ids),
        epoch=np.concatenate(ep),
        iteration=np.arange(g) // prompts_per_iteration,
        prompt_len=np.concatenate(pl).astype(np.int64),
        response_len=np.concatenate(rl).astype(np.int64),
        source=trace.source,
        turns=Turns.concat(tparts) if tparts else None,
    )


def from_arrays(
    response_len: np.ndarray,
    prompt_len: np.ndarray | int = 1,
    prompts_per_iteration: int | None = None,
) -> Workload:
    """A hand-made workload (tests): `response_len` is (iterations * groups, n), in dispatch order."""
    r = np.asarray(response_len, dtype=np.int64)
    if r.ndim != 2 or r.size == 0 or r.min() < 1:
        raise UserError("response_len must be a non-empty (groups, n) matrix of positive lengths")
    g = r.shape[0]
    p = prompts_per_iteration or g
    if g % p:
        raise UserError(f"{g} groups do not make whole iterations of {p}")
    pl = np.broadcast_to(np.asarray(prompt_len, dtype=np.int64), (g,)).copy()
    return Workload(
        r.shape[1],
        p,
        np.array([f"g{i}" for i in range(g)]),
        np.zeros(g, dtype=np.int64),
        np.arange(g) // p,
        pl,
        r,
    )


def with_turns(workload: Workload, turns: Turns) -> Workload:
    """`workload` as multi-turn trajectories (tests, hand-made cases): sample s = g * n + j gets row s
    of `turns`, and its response length becomes its turns' model tokens."""
    if len(turns) != workload.response_len.size:
        raise UserError(f"turns has {len(turns)} rows, the workload {workload.response_len.size} samples")
    if turns.model.size == 0 or turns.model.min() < 1 or np.any(turns.counts < 1):
        raise UserError("every sample needs >= 1 turn of >= 1 model token")
    resp = turns.per_row(turns.model).reshape(workload.response_len.shape).astype(np.int64)
    return replace(workload, response_len=resp, turns=turns)
