"""Plan-to-dispatch for a continuous-batching (streaming) executor: which pending group goes where, now.

One module that both the simulator (`asp_npu.sim`) and the real pipeline controller call, so what is
measured is what runs. An executor that streams groups into vLLM's continuous-batching queue does not
run "units" one at a time: every instance keeps its slots full and a version's admissions arrive in
one burst when the lag ledger opens (`asp_npu.pipeline.staleness`). Two things then decide how fast the
slowest group of a version finishes -- and that group gates trainer step `version + max_lag`:

- *skewness of the tail*: a decode step costs `a + b*running + c*kv_tokens` (`schedule.cost`); an
  instance that holds several predicted-long groups carries far more KV tokens, so its stragglers decode
  slower than the same stragglers spread over the instances. FIFO spreads them by chance; we spread
  them by rule: each instance's in-flight load is its groups' predicted KV token-steps (`n * L^2 / 2`,
  the cost model's `c` term, `cost.group_kv_token_steps`), and an instance asking for work takes the
  longest pending group when its load is at or below the mean (LPT over the tail) and the shortest
  otherwise (it keeps its slots busy without adding to its tail).
- *the admission window*: pending groups are offered one admission slice (a weights version's worth of
  groups) at a time, so every version's long groups are admitted in its opening burst.

API (stable)::

    d = StreamDispatcher(num_instances)
    d.add(group_ids, predicted_len)            # groups that may be dispatched (any hashable ids)
    j = d.choose(candidates, instance)          # index into `candidates` (pending group ids) to start on
                                                # `instance` now; records the placement
    d.done(group_id)                            # the group finished (or was cancelled): free its load
    d.load -> list[float]                       # per-instance predicted in-flight KV token-steps

`choose` is O(len(candidates)); candidates are the pending groups of the current admission slice.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


class StreamDispatcher:
    """Tail-spreading group dispatch for continuous-batching instances (see module docstring)."""

    def __init__(self, num_instances: int) -> None:
        if num_instances < 1:
            raise ValueError(f"num_instances must be >= 1 (got {num_instances})")
        self.load = [0.0] * num_instances
        self._pred: dict[Hashable, float] = {}
        self._where: dict[Hashable, tuple[int, float]] = {}

    def add(self, group_ids: Sequence[Hashable], predicted_len: Sequence[float]) -> None:
        """Register groups with their predicted response length (tokens per sample)."""
        for g, p in zip(group_ids, predicted_len, strict=True):
            self._pred[g] = float(p)

    def weight(self, group_id: Hashable) -> float:
        """Predicted KV token-steps of a group per sample (`L^2 / 2`): what it adds to an instance's decode."""
        p = self._pred[group_id]
        return 0.5 * p * p

    def choose(self, candidates: Sequence[Hashable], instance: int) -> int:
        """Index of the candidate `instance` should start now (longest if its load <= mean, else shortest)."""
        if not candidates:
            raise ValueError("no candidates to choose from")
        pred = self._pred
        mean = sum(self.load) / len(self.load)
        if self.load[instance] <= mean:
            j = max(range(len(candidates)), key=lambda k: (pred[candidates[k]], -k))
        else:
            j = min(range(len(candidates)), key=lambda k: (pred[candidates[k]], k))
        g = candidates[j]
        w = self.weight(g)
        self._where[g] = (instance, w)
        self.load[instance] += w
        return j

    def done(self, group_id: Hashable) -> None:
        """A dispatched group finished or was cancelled: remove its load (unknown ids are ignored)."""
        placed = self._where.pop(group_id, None)
        if placed is not None:
            i, w = placed
            self.load[i] -= w
        self._pred.pop(group_id, None)
