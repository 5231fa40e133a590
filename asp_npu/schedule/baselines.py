"""Comparison plans with the planner's inputs: FIFO and random dispatch, same unit size, no lengths used.

They model dispatchers without a length predictor (MindSpeed-RL/verl style): units are cut from the
dataset order (FIFO) or a seeded shuffle (random) and dealt round-robin to instances. Their summary is
computed by the same timeline and lag rule as the ASP plan, so numbers compare side by side. Unit ids
are the dispatch order, so a dynamic executor (the simulator's `async-fifo`) may pull units by id.
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from asp_npu.schedule.plan import Groups, RolloutPlan
from asp_npu.schedule.planner import PlannerConfig, assemble, check_inputs, make_units
from asp_npu.schedule.skewness import lpt


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


# ------------------------------------------------------------------- partitioners of whole groups


def karmarkar_karp(weights: np.ndarray, k: int) -> np.ndarray:
    """Partition index per item: Karmarkar-Karp's largest differencing method for k-way partitioning.

    The balance reference for the planner (the method verl's `get_seqlen_balanced_partitions` uses to
    balance sequence lengths across data-parallel ranks). Each item starts as a k-tuple of partial
    sums (itself plus k-1 empty sets); the two tuples with the largest spread are merged, the
    largest set of one joined with the smallest of the other, until one tuple is left. Sets are
    joined through parent links, so the whole run is O(n k log k + n log n).
    """
    w = np.asarray(weights, dtype=np.float64)
    n = int(w.shape[0])
    if k < 1:
        raise ValueError(f"k must be >= 1 (got {k})")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    parent = list(range(n))
    heap: list[tuple[float, float, int, list[float], list[int]]] = []
    for i in np.argsort(w, kind="stable").tolist():
        sums = [float(w[i])] + [0.0] * (k - 1)
        roots = [i] + [-1] * (k - 1)
        heap.append((-sums[0], -sums[0], i, sums, roots))
    heapq.heapify(heap)
    tick = n
    while len(heap) > 1:
        _, _, _, s0, r0 = heapq.heappop(heap)
        _, _, _, s1, r1 = heapq.heappop(heap)
        merged = []
        for i in range(k):  # largest of one with the smallest of the other
            a, b = r0[i], r1[k - 1 - i]
            if a < 0:
                a, b = b, a
            elif b >= 0:
                parent[b] = a
            merged.append((s0[i] + s1[k - 1 - i], a))
        merged.sort(key=lambda t: -t[0])
        sums = [t[0] for t in merged]
        roots = [t[1] for t in merged]
        heapq.heappush(heap, (-(sums[0] - sums[-1]), -sums[0], tick, sums, roots))
        tick += 1
    _, _, _, _, roots = heap[0]
    label = {r: j for j, r in enumerate(roots) if r >= 0}
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        root = i
        while parent[root] != root:
            root = parent[root]
        x = i
        while parent[x] != root:  # path compression
            parent[x], x = root, parent[x]
        out[i] = label[root]
    return out


def lpt_partition(weights: np.ndarray, k: int) -> np.ndarray:
    """Partition index per item: sort by weight, longest first onto the least-loaded partition."""
    return lpt(np.asarray(weights, dtype=np.float64), k)
