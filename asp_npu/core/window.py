"""The window planner: predict -> plan -> units, for one planning window (= one iteration's groups).

The simulator and the Ray controller both call `WindowPlanner.plan`; they differ only in what they
hand it (their group ids, the predictor's prompt ids and prompt lengths, the planner's seed and the
trainer step time they know). The mode row decides the rest:

- planner `asp`: `schedule.planner.plan` on the predicted lengths; `fifo`: `schedule.baselines.fifo_plan`
  (prompt order, the same unit size) -- with no predictor, FIFO plans on unit lengths;
- dispatch `static`: units carry their planned instance, in each instance's planned order;
  `pull`: units by unit id (a valid global order); `stream`: one unit per group (the feed's
  StreamDispatcher chooses among them), the plan is only recorded.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from asp_npu.core.modes import Mode
from asp_npu.core.records import GroupKey, Unit
from asp_npu.schedule.baselines import fifo_plan
from asp_npu.schedule.plan import Groups, RolloutPlan
from asp_npu.schedule.planner import PlannerConfig, plan
from asp_npu.types import PromptItem


@dataclass
class WindowPlan:
    window: int
    units: list[Unit]
    plan: RolloutPlan | None  # None: a stream window whose plan was not asked for


class WindowPlanner:
    """One per run. `step_seconds(mean predicted lengths, prompt lengths)` is the trainer's seconds
    per minibatch the planner overlaps with (the controller measures it, the simulator models it)."""

    def __init__(self, mode: Mode, group_size: int, base: PlannerConfig, predictor: Any | None = None,
                 step_seconds: Callable[[np.ndarray, np.ndarray], float] | None = None) -> None:
        self.mode, self.G, self.base, self.predictor = mode, group_size, base, predictor
        self.step_seconds = step_seconds or (lambda _mean, _plen: 0.0)
        self.next_uid = 0

    def plan(self, window: int, keys: Sequence[Hashable], predict_ids: np.ndarray, prompt_lens: np.ndarray,
             seed: int, record_stream: bool = True) -> WindowPlan:
        """Units of window `window` over the groups `keys` (the driver's ids, in data-loader order)."""
        n, G = len(keys), self.G
        if self.predictor is not None:
            est = self.predictor.predict_many(predict_ids, prompt_lens)
            mean, q50, q90 = (np.maximum(x, 1.0) for x in (est.mean, est.q50, est.q90))
        else:
            mean = q50 = q90 = np.ones(n)
        stream = self.mode.dispatch == "stream"
        p = None
        if not stream or record_stream:
            groups = Groups(np.array([str(k) for k in keys], dtype=str), np.tile(np.arange(G), (n, 1)),
                            mean, q50, q90, prompt_lens if self.predictor is not None else None)
            cfg = replace(self.base, seed=seed, train_step_s=self.step_seconds(mean, prompt_lens))
            p = plan(groups, cfg) if self.mode.planner == "asp" else fifo_plan(groups, cfg)
        if stream:
            units = [self._unit(window, (k,), -1, float(m) * G, float(q)) for k, m, q in
                     zip(keys, mean.tolist(), q90.tolist(), strict=True)]
        else:
            assert p is not None
            units = self._units_of(window, p, keys, q90)
        return WindowPlan(window, units, p)

    def _units_of(self, window: int, p: RolloutPlan, keys: Sequence[Hashable], q90: np.ndarray) -> list[Unit]:
        static = self.mode.dispatch == "static"
        order = [int(u) for ids in p.instance_units for u in ids] if static else list(range(p.num_units))
        units = []
        for u in order:
            lo, hi = int(p.unit_offsets[u]), int(p.unit_offsets[u + 1])
            rows = list(dict.fromkeys(p.sample_group[lo:hi].tolist()))
            units.append(self._unit(window, tuple(keys[r] for r in rows),
                                    int(p.unit_instance[u]) if static else -1,
                                    float(p.sample_predicted_len[lo:hi].sum()), float(q90[rows].max())))
        return units

    def _unit(self, window: int, groups: tuple[Hashable, ...], instance: int, tokens: float,
              q90: float) -> Unit:
        u = Unit(self.next_uid, window, groups, self.G, instance, tokens, q90)
        self.next_uid += 1
        return u


def replacement_shortfall(target: int, planned: int, filtered: int) -> int:
    """Groups still to plan so that `target` groups get trained (DAPO dynamic sampling): each group
    filtered after it was planned is replaced by the next prompt of the data order. <= 0: none."""
    return target - (planned - filtered)


@dataclass
class GroupSupply:
    """Groups planned and groups DAPO dynamic sampling filtered so far (a resumed run: restored)."""

    planned: int = 0
    filtered: int = 0

    def shortfall(self, target: int) -> int:
        return replacement_shortfall(target, self.planned, self.filtered)

    def metrics(self, trained: int, samples: int) -> dict[str, float]:
        """One step's metrics (`trained`: groups trained so far, `samples`: this step's samples)."""
        return {"dynamic_sampling/filtered_groups": self.filtered,
                "dynamic_sampling/minibatch_samples": samples,
                "dynamic_sampling/filtered_fraction": self.filtered / max(1, self.filtered + trained)}


def window_stream(prompts: list[PromptItem], window: int, seed: int) -> Callable[[int], list[PromptItem]]:
    """Window w's prompts: epochs are seeded permutations of the dataset, cut into consecutive windows.

    Each returned item is a copy whose id is its group's wire id (`str(GroupKey(prompt_id, epoch))`),
    so the same prompt in two epochs is two groups; `meta["base_id"]`/`meta["epoch"]` keep what the
    predictor needs.
    """
    n = len(prompts)
    cache: dict[int, list[int]] = {}

    def order(epoch: int) -> list[int]:
        if epoch not in cache:
            idx = list(range(n))
            random.Random(seed * 1_000_003 + epoch).shuffle(idx)
            cache[epoch] = idx
        return cache[epoch]

    def get(w: int) -> list[PromptItem]:
        out = []
        for pos in range(w * window, (w + 1) * window):
            epoch, k = divmod(pos, n)
            base = prompts[order(epoch)[k]]
            meta = {**base.meta, "epoch": epoch, "base_id": base.prompt_id}
            out.append(PromptItem(str(GroupKey(base.prompt_id, epoch)), base.prompt_token_ids, base.text,
                                  base.ground_truth, meta))
        return out

    return get
