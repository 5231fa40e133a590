"""Shared generators of planner inputs, including shapes our trace generator never produces."""

from __future__ import annotations

import numpy as np

from asp_npu.schedule.plan import Groups

SHAPES = ("lognormal", "bimodal", "heavy", "equal", "tiny")


def make_groups(n_groups: int, group_size: int, shape: str, seed: int) -> Groups:
    rng = np.random.default_rng(seed)
    if shape == "lognormal":
        mean = rng.lognormal(7.5, 1.0, n_groups)
    elif shape == "bimodal":
        mean = np.where(
            rng.random(n_groups) < 0.3, rng.lognormal(8.7, 0.2, n_groups), rng.lognormal(6.4, 0.2, n_groups)
        )
    elif shape == "heavy":
        mean = 200.0 * (rng.pareto(1.1, n_groups) + 1.0)
    elif shape == "equal":
        mean = np.full(n_groups, 1000.0)
    else:  # tiny
        mean = rng.integers(1, 4, n_groups).astype(float)
    q50 = mean * 0.9
    q90 = mean * rng.uniform(1.0, 3.0, n_groups)
    ids = np.array([f"g{i}" for i in range(n_groups)])
    idxs = np.tile(np.arange(group_size), (n_groups, 1))
    return Groups(ids, idxs, mean, q50, np.maximum(q90, q50))
