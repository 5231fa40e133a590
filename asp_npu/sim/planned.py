"""Planned work sources of the simulator: the one window planner (`asp_npu.core.window`) over a workload.

When an instance first needs window `w`, the predictor (fed every finished group so far, as the real
controller feeds it) predicts the window's groups and `WindowPlanner` lays them out as units -- the
same call the Ray controller makes. The simulator then executes the units against the actual lengths.

A multi-turn workload's predictor is the `TrajectoryPredictor` around the named one: fed each
finished trajectory's total tokens, turns and tool-wait seconds, it hands the planner decode tokens
with the tool wait on the tail (`asp_npu.predict.trajectory`), so trajectories are planned as samples.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from asp_npu.core.modes import Mode
from asp_npu.core.records import Unit
from asp_npu.core.window import WindowPlanner
from asp_npu.predict.factory import make_predictor
from asp_npu.predict.trajectory import TrajectoryPredictor
from asp_npu.schedule.cost import CostModel
from asp_npu.schedule.planner import PlannerConfig
from asp_npu.sim.cost import SimCost
from asp_npu.sim.workload import Workload


class PlannedSource:
    """`units_for(window)` -> the window's units; `observe(g)` after a group finishes.

    Windows hold `window` iterations each. `predictor=None` plans without predictions (FIFO units).
    """

    def __init__(
        self,
        workload: Workload,
        mode: Mode,
        planner_cfg: PlannerConfig,
        cost: SimCost | None = None,
        trainer_devices: int = 1,
        predictor: str | None = "history",
        seed: int = 0,
        window: int = 1,
    ) -> None:
        self.w, self.window, self.seed = workload, window, seed
        self.predictor_name = predictor
        self.pred = make_predictor(predictor) if predictor else None
        self.tool_s = workload.tool_seconds if workload.multi_turn else None
        if self.pred is not None and workload.turns is not None:
            step_s = cost.decode_a + cost.decode_b * planner_cfg.max_num_seqs if cost is not None else 1.0
            self.pred = TrajectoryPredictor(self.pred, step_s)
        self.turn_counts = (workload.turns.counts.reshape(workload.response_len.shape)
                            if workload.turns is not None else None)
        self.cost, self.trainer_devices = cost, trainer_devices
        self.planner = WindowPlanner(mode, workload.group_size, planner_cfg, self.pred, self._step_seconds)
        self.plans: list[dict] = []

    def _step_seconds(self, mean: np.ndarray, prompt_lens: np.ndarray) -> float:
        if self.cost is None:
            return 0.0
        tokens_per_step = self.planner.base.minibatch * float(np.mean(mean) + np.mean(prompt_lens))
        return self.cost.train_step_s + tokens_per_step * self.cost.train_s_per_token / self.trainer_devices

    def observe(self, g: int) -> None:
        if self.pred is None:
            return
        w, n = self.w, self.w.group_size
        if isinstance(self.pred, TrajectoryPredictor):
            assert self.turn_counts is not None and self.tool_s is not None
            self.pred.observe_trajectories(np.repeat(w.prompt_ids[g], n), np.repeat(w.epoch[g], n),
                                           w.response_len[g], self.turn_counts[g], self.tool_s[g],
                                           np.repeat(w.prompt_len[g], n))
            return
        self.pred.observe_many(
            np.repeat(w.prompt_ids[g], n), np.repeat(w.epoch[g], n), w.response_len[g],
            np.repeat(w.prompt_len[g], n),
        )

    @property
    def n_windows(self) -> int:
        return -(-self.w.num_iterations // self.window)

    def __call__(self, window: int) -> list[Unit[int]]:
        """Plan window `window` (iterations window*W .. window*W + W - 1)."""
        w = self.w
        its = range(window * self.window, min((window + 1) * self.window, w.num_iterations))
        gids = np.concatenate([w.iteration_groups(it) for it in its])
        if self.predictor_name == "oracle":
            n = w.group_size
            self.pred.reveal(np.repeat(w.prompt_ids[gids], n), w.response_len[gids].ravel())  # type: ignore[union-attr]
        wp = self.planner.plan(window, gids.tolist(), w.prompt_ids[gids], w.prompt_len[gids], self.seed,
                               record_stream=False)
        if wp.plan is not None and self.pred is not None:
            self.plans.append(wp.plan.summary)
        return wp.units


def planner_config(workload: Workload, cost: SimCost | None, instances: int, slots: int,
                   minibatch_samples: int, max_lag: int, seed: int = 0) -> PlannerConfig:
    """The planner settings of a simulated run (cost model = the simulator's decode cost)."""
    cfg = PlannerConfig(num_instances=instances, minibatch=minibatch_samples, group_size=workload.group_size,
                        max_num_seqs=slots, max_lag=max_lag)
    if cost is None:
        return cfg
    return replace(cfg, seed=seed, cost=CostModel(cost.decode_a, cost.decode_b, cost.decode_c))
