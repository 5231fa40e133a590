"""Plan quality measured on *actual* lengths: token balance, padding spread, realised makespan.

The planner only sees predictions; these functions replay a plan (same units, instances and order)
with the true response lengths, under the same cost model and lag rule, so ASP and the baselines are
compared on what would really happen.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asp_npu.schedule.padding import intra_unit_spread
from asp_npu.schedule.plan import RolloutPlan
from asp_npu.schedule.planner import PlannerConfig
from asp_npu.schedule.timeline import timeline


def actual_unit_seconds(
    plan: RolloutPlan, actual_len: np.ndarray, cfg: PlannerConfig, prompt_len: np.ndarray | None = None
) -> np.ndarray:
    """Seconds of each unit with the true lengths (`actual_len` aligned with the plan's sample rows)."""
    starts = plan.unit_offsets[:-1]
    lens = actual_len.astype(np.float64)
    longest = np.maximum.reduceat(lens, starts)
    total = np.add.reduceat(lens, starts)
    kv: np.ndarray | float = 0.0
    if cfg.cost.c > 0:
        p = 0.0 if prompt_len is None else prompt_len.astype(np.float64)
        kv = np.add.reduceat(p * lens + 0.5 * lens * lens, starts)
    return cfg.cost.unit_seconds(longest, total, cfg.max_num_seqs, kv)


def plan_quality(plan: RolloutPlan, actual_len: np.ndarray, cfg: PlannerConfig) -> dict[str, Any]:
    """Token-load balance, intra-unit spread and realised makespan of `plan` on the true lengths."""
    unit_of = plan.sample_unit
    tokens = np.bincount(plan.unit_instance[unit_of], weights=actual_len, minlength=plan.num_instances)
    secs = actual_unit_seconds(plan, actual_len, cfg)
    order = [ids.tolist() for ids in plan.instance_units]
    last = -1
    sizes = plan.unit_sizes
    if sizes.size and sizes.min() != sizes.max():
        # the remainder unit keeps its place: admitted after every other unit
        last = int(np.argmin(sizes))
    tl = timeline(order, secs, sizes, cfg.minibatch, cfg.max_lag, cfg.train_step_s, last)
    busy = np.bincount(plan.unit_instance, weights=secs, minlength=plan.num_instances)
    lower = float(max(secs.sum() / plan.num_instances, secs.max()))
    makespan = float(tl.finish.max())
    spread = intra_unit_spread(actual_len, plan.unit_offsets)
    return {
        "token_load_max_over_mean": round(float(tokens.max() / tokens.mean()), 4),
        "token_load_min_over_mean": round(float(tokens.min() / tokens.mean()), 4),
        "busy_max_over_mean": round(float(busy.max() / busy.mean()), 4),
        "intra_unit_spread_mean": round(float(spread.mean()), 4),
        "work_seconds": round(float(secs.sum()), 1),
        "realised_makespan": round(makespan, 1),
        "realised_lower_bound": round(lower, 1),
        "realised_ratio": round(makespan / lower, 4),
        "admission_wait_s": round(tl.admission_wait_s, 1),
        "realised_trainer_end": round(float(tl.step_end[-1]), 1) if tl.step_end.size else 0.0,
        "trainer_idle_s": round(tl.trainer_idle_s, 1),
    }
