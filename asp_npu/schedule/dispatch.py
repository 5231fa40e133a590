"""Plan-to-dispatch for a continuous-batching (streaming) executor: which pending group goes where, now.

One module that both the simulator (`asp_npu.sim`) and the real pipeline controller call, so what is
measured is what runs. An executor that streams groups into vLLM's continuous-batching queue does not
run "units" one at a time: every instance keeps its slots full and a version's admissions arrive in
one burst when the lag ledger opens (`asp_npu.pipeline.staleness`). Two things then decide how fast the
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

API (stable)::

    d = StreamDispatcher(num_instances)
    d.add(group_ids, predicted_len)            # groups that may be dispatched (any hashable ids)
    j = d.choose(candidates, instance)          # index into `candidates` (pending group ids) to start on
                                                # `instance` now; records the placement
    d.done(group_id)                            # the group finished (or was cancelled): free its load
    d.unplace(group_id)                         # `choose` was not acted on (admission refused): undo it
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
        """Predicted KV token-steps per sample (`L^2 / 2`): what the group adds to an instance's decode."""
        p = self._pred[group_id]
        return 0.5 * p * p

    def choose(self, candidates: Sequence[Hashable], instance: int) -> int:
        """Index of the candidate `instance` should start now (fair-share first-fit decreasing).

        The least-loaded instance takes the longest candidate (LPT: the longest groups land on
        different instances); any other instance takes the longest candidate that keeps it within its
        fair share of the in-flight plus pending load, and the shortest when none does.
        """
        if not candidates:
            raise ValueError("no candidates to choose from")
        ws = [self.weight(g) for g in candidates]
        load = self.load
        if load[instance] <= min(load):
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
