"""Comparison plans with the planner's inputs: FIFO and random dispatch, same unit size, no lengths used.

They model dispatchers without a length predictor (MindSpeed-RL/verl style): units are cut from the
dataset order (FIFO) or a seeded shuffle (random) and dealt round-robin to instances. Their summary is
computed by the same timeline and lag rule as the ASP plan, so numbers compare side by side. Unit ids
are the dispatch order, so a dynamic executor (the simulator's `async-fifo`) may pull units by id.
"""

from __future__ import annotations

import time

import numpy as np

from asp_npu.schedule.plan import Groups, RolloutPlan
from asp_npu.schedule.planner import PlannerConfig, assemble, check_inputs, make_units


def _dealt_plan(
    groups: Groups, cfg: PlannerConfig, order: np.ndarray, dispatch: str, t0: float, c0: float
) -> RolloutPlan:
    check_inputs(groups, cfg)
    units = make_units(groups, cfg, order)
    u = units.seconds.size
    assign = np.arange(u, dtype=np.int64) % cfg.num_instances
    instance_order = [list(range(k, u, cfg.num_instances)) for k in range(cfg.num_instances)]
    plan = assemble(groups, cfg, units, assign, instance_order, dispatch, t0)
    plan.summary["plan_seconds"] = round(time.perf_counter() - t0, 4)
    plan.summary["plan_cpu_seconds"] = round(time.process_time() - c0, 4)
    return plan


def fifo_plan(groups: Groups, cfg: PlannerConfig) -> RolloutPlan:
    """Groups in input order, cut into units, dealt round-robin."""
    t0 = time.perf_counter()
    c0 = time.process_time()
    return _dealt_plan(groups, cfg, np.arange(len(groups)), "fifo", t0, c0)


def random_plan(groups: Groups, cfg: PlannerConfig) -> RolloutPlan:
    """Groups in a seeded random order, cut into units, dealt round-robin."""
    t0 = time.perf_counter()
    c0 = time.process_time()
    return _dealt_plan(
        groups, cfg, np.random.default_rng(cfg.seed).permutation(len(groups)), "random", t0, c0
    )
