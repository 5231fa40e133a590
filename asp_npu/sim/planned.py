"""ASP's work source in the simulator: the real predictor and the real planner, one plan per iteration.

When an instance first needs iteration `it`, the predictor (fed every finished group so far, as the
real controller feeds it) predicts the iteration's groups and `asp_npu.schedule.planner.plan` lays
them out on the instances. The simulator then executes the plan against the actual lengths.
"""

from __future__ import annotations

import numpy as np

from asp_npu.predict.factory import make_predictor
from asp_npu.schedule.baselines import fifo_plan
from asp_npu.schedule.cost import CostModel
from asp_npu.schedule.dispatch import StreamDispatcher
from asp_npu.schedule.plan import Groups
from asp_npu.schedule.planner import PlannerConfig, plan
from asp_npu.sim.cost import SimCost
from asp_npu.sim.workload import Workload


class PlannedSource:
    """`units_for(it)` -> per instance, ordered lists of group ids; `observe(g)` after a group finishes.

    With `stream=True` (continuous-batching executor) a window is returned as one pending list of
    single groups and `dispatcher` (a `StreamDispatcher` fed the same predictions) picks from it.
    """

    def __init__(
        self,
        workload: Workload,
        cost: SimCost,
        instances: int,
        slots: int,
        minibatch_samples: int,
        max_lag: int,
        trainer_devices: int,
        predictor: str = "history",
        seed: int = 0,
        window: int = 1,
        stream: bool = False,
    ) -> None:
        self.w = workload
        self.stream = stream
        mb_groups = max(1, minibatch_samples // workload.group_size)
        self.dispatcher = StreamDispatcher(instances, slice_groups=mb_groups)
        self.window = window
        self.instances = instances
        self.predictor_name = predictor
        self.pred = make_predictor(predictor)
        self.cfg_base = dict(
            num_instances=instances,
            minibatch=minibatch_samples,
            group_size=workload.group_size,
            max_num_seqs=slots,
            max_lag=max_lag,
            seed=seed,
            cost=CostModel(cost.decode_a, cost.decode_b, cost.decode_c),
        )
        self.cost = cost
        self.trainer_devices = trainer_devices
        self.plans: list[dict] = []

    def observe(self, g: int) -> None:
        self.dispatcher.done(int(g))
        w = self.w
        n = w.group_size
        self.pred.observe_many(
            np.repeat(w.prompt_ids[g], n),
            np.repeat(w.epoch[g], n),
            w.response_len[g],
            np.repeat(w.prompt_len[g], n),
        )

    @property
    def n_windows(self) -> int:
        return -(-self.w.num_iterations // self.window)

    def __call__(self, window: int) -> list[list[list[int]]]:
        """Plan window `window` (iterations window*W .. window*W + W - 1) on the instances."""
        w = self.w
        its = range(window * self.window, min((window + 1) * self.window, w.num_iterations))
        gids = np.concatenate([w.iteration_groups(it) for it in its])
        n = w.group_size
        if self.predictor_name == "oracle":
            self.pred.reveal(np.repeat(w.prompt_ids[gids], n), w.response_len[gids].ravel())  # type: ignore[attr-defined]
        est = self.pred.predict_many(w.prompt_ids[gids], w.prompt_len[gids])
        groups = Groups(
            w.prompt_ids[gids],
            np.tile(np.arange(n), (gids.size, 1)),
            est.mean,
            est.q50,
            est.q90,
            w.prompt_len[gids],
        )
        if self.stream:
            self.dispatcher.add(gids.tolist(), est.q90.tolist())
            return [[[int(g)] for g in gids.tolist()]]
        mb = self.cfg_base["minibatch"]
        tokens_per_step = mb * float(np.mean(est.mean) + np.mean(w.prompt_len[gids]))
        cfg = PlannerConfig(
            train_step_s=tokens_per_step * self.cost.train_s_per_token / self.trainer_devices, **self.cfg_base
        )
        p = plan(groups, cfg)
        self.plans.append(p.summary)
        out: list[list[list[int]]] = []
        for ids in p.instance_units:
            units = []
            for u in ids.tolist():
                lo, hi = int(p.unit_offsets[u]), int(p.unit_offsets[u + 1])
                units.append(gids[p.sample_group[lo:hi:n]].tolist())
            out.append(units)
        return out


class FifoUnitSource:
    """async-fifo under the unit executor: `baselines.fifo_plan` units (data-loader order, the same unit
    size as ASP's plan of the same window), returned as one global list that instances pull by unit id."""

    def __init__(
        self,
        workload: Workload,
        instances: int,
        slots: int,
        minibatch_samples: int,
        max_lag: int,
        window: int = 1,
    ) -> None:
        self.w, self.window = workload, window
        self.cfg = PlannerConfig(
            num_instances=instances,
            minibatch=minibatch_samples,
            group_size=workload.group_size,
            max_num_seqs=slots,
            max_lag=max_lag,
        )

    @property
    def n_windows(self) -> int:
        return -(-self.w.num_iterations // self.window)

    def __call__(self, window: int) -> list[list[list[int]]]:
        w, n = self.w, self.w.group_size
        its = range(window * self.window, min((window + 1) * self.window, w.num_iterations))
        gids = np.concatenate([w.iteration_groups(it) for it in its])
        ones = np.ones(gids.size)  # FIFO does not look at lengths
        p = fifo_plan(
            Groups(w.prompt_ids[gids], np.tile(np.arange(n), (gids.size, 1)), ones, ones, ones), self.cfg
        )
        return [
            [
                gids[p.sample_group[int(p.unit_offsets[u]) : int(p.unit_offsets[u + 1]) : n]].tolist()
                for u in range(p.num_units)
            ]
        ]
