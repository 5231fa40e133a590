"""Plan-to-dispatch for a continuous-batching (streaming) executor: which pending group goes where, now.

One module that both the simulator (`asp_npu.sim`) and the real pipeline controller call, so what is
measured is what runs. An executor that streams groups into vLLM's continuous-batching queue does not
run "units" one at a time: every instance keeps its slots full and a version's admissions arrive in
one burst when the lag ledger opens (`asp_npu.core.staleness`). Two things then decide how fast the
slowest group of a version finishes -- and that group gates trainer step `version + max_lag`:

- *skewness of the tail*: a decode step costs `a + b*running + c*kv_tokens` (`schedule.cost`); an
  instance that holds several predicted-long groups carries far more KV tokens, so its stragglers decode
  slower than the same stragglers spread over the instances. FIFO spreads them by chance; we spread
  them by rule: each instance's in-flight load is its groups' predicted KV token-steps (`L^2 / 2` per
  sample, the cost model's `c` term, `cost.group_kv_token_steps`). The least-loaded instance asking
  for work takes the longest pending group (LPT over the tail); any other takes the longest pending
  group that keeps it within its fair share `(in-flight + pending load) / K`, else the shortest (it
  keeps its slots busy without adding to its tail). Instances fill their slots one after another in
  an admission burst, so the fair share (not "longest while below the mean") is what stops the
  last instance to ask from collecting every medium-long group.
- *the admission window*: pending groups are offered one admission slice (a weights version's worth of
  groups) at a time, so every version's long groups are admitted in its opening burst.
- *one instance*: there is no tail to spread, and longest-first would put a window's long groups
  into the same admission bursts, i.e. the same minibatches: those then carry all the stragglers a
  lag-bounded trainer waits for, and all the long sequences it trains on at once (measured on the
  real pipeline, docs/BENCHMARKS.md issue 6, session 4). With `slice_groups` (groups admitted per
  weights version) a single instance takes groups in `smooth_order`: each slice holds an even share
  of long and short groups, longest first within the slice.

API (stable)::

    d = StreamDispatcher(num_instances, slice_groups=0)
    d.add(group_ids, predicted_len)            # one window's groups (any hashable ids)
    j = d.choose(candidates, instance)          # index into `candidates` (pending group ids) to start on
                                                # `instance` now; records the placement
    d.done(group_id)                            # the group finished (or was cancelled): free its load
    d.unplace(group_id)                         # `choose` was not acted on (admission refused): undo it
    d.load -> list[float]                       # per-instance predicted in-flight KV token-steps

`choose` is O(len(candidates)); candidates are the pending groups of the current admission slice.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence


def smooth_order(predicted: Sequence[float], slice_size: int) -> list[int]:
    """Indices of `predicted` in an order whose consecutive slices of `slice_size` each hold an even
    share of the long and the short items: the longest-first ranking is dealt over the slices in a
    snake (1, 2, .., k, k, .., 1, ...), so every slice takes one of each k consecutive ranks and the
    slice sizes differ by at most one. Longest first within a slice."""
    n = len(predicted)
    k = max(1, math.ceil(n / max(1, slice_size)))
    ranked = sorted(range(n), key=lambda i: (-predicted[i], i))
    slices: list[list[int]] = [[] for _ in range(k)]
    for r, i in enumerate(ranked):
        rnd, pos = divmod(r, k)
        slices[pos if rnd % 2 == 0 else k - 1 - pos].append(i)
    return [i for sl in slices for i in sl]


class StreamDispatcher:
    """Tail-spreading group dispatch for continuous-batching instances (see module docstring)."""

    def __init__(self, num_instances: int, slice_groups: int = 0) -> None:
        if num_instances < 1:
            raise ValueError(f"num_instances must be >= 1 (got {num_instances})")
        if slice_groups < 0:
            raise ValueError(f"slice_groups must be >= 0 (got {slice_groups})")
        self.load = [0.0] * num_instances
        self.slice_groups = slice_groups
        self._pred: dict[Hashable, float] = {}
        self._where: dict[Hashable, tuple[int, float]] = {}
        self._rank: dict[Hashable, int] = {}  # single instance: position in its window's smooth order
        self._added = 0

    def add(self, group_ids: Sequence[Hashable], predicted_len: Sequence[float]) -> None:
        """Register one window's groups with their predicted response length (tokens per sample)."""
        for g, p in zip(group_ids, predicted_len, strict=True):
            self._pred[g] = float(p)
        if len(self.load) == 1 and self.slice_groups > 0:
            for pos, i in enumerate(smooth_order(predicted_len, self.slice_groups)):
                self._rank[group_ids[i]] = self._added + pos
            self._added += len(group_ids)

    def weight(self, group_id: Hashable) -> float:
        """Predicted KV token-steps per sample (`L^2 / 2`): what the group adds to an instance's decode."""
        p = self._pred[group_id]
        return 0.5 * p * p

    def choose(self, candidates: Sequence[Hashable], instance: int) -> int:
        """Index of the candidate `instance` should start now (fair-share first-fit decreasing).

        The least-loaded instance takes the longest candidate (LPT: the longest groups land on
        different instances); any other instance takes the longest candidate that keeps it within its
        fair share of the in-flight plus pending load, and the shortest when none does. A single
        instance with `slice_groups` takes the candidate earliest in its window's `smooth_order`.
        """
        if not candidates:
            raise ValueError("no candidates to choose from")
        ws = [self.weight(g) for g in candidates]
        load = self.load
        if self._rank and all(g in self._rank for g in candidates):
            j = min(range(len(candidates)), key=lambda k: self._rank[candidates[k]])
        elif load[instance] <= min(load):
            j = max(range(len(ws)), key=lambda k: (ws[k], -k))
        else:
            room = (sum(load) + sum(ws)) / len(load) - load[instance]
            fits = [k for k in range(len(ws)) if ws[k] <= room]
            if fits:
                j = max(fits, key=lambda k: (ws[k], -k))
            else:
                j = min(range(len(ws)), key=lambda k: (ws[k], k))
        g = candidates[j]
        self._where[g] = (instance, ws[j])
        load[instance] += ws[j]
        return j

    def unplace(self, group_id: Hashable) -> None:
        """Undo the placement `choose` recorded (the group stays pending with its prediction)."""
        placed = self._where.pop(group_id, None)
        if placed is not None:
            self.load[placed[0]] -= placed[1]

    def done(self, group_id: Hashable) -> None:
        """A dispatched group finished or was cancelled: remove its load (unknown ids are ignored)."""
        placed = self._where.pop(group_id, None)
        if placed is not None:
            i, w = placed
            self.load[i] -= w
        self._pred.pop(group_id, None)
        self._rank.pop(group_id, None)
