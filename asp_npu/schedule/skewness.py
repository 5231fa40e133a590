"""Skewness: place units on instances so the predicted makespan is balanced and the tail is spread.

LPT (longest unit first onto the least-loaded instance: the K longest units land on K different
instances), then local refinement between the most and a less loaded instance: the single move or
pairwise swap that most reduces their larger load, until none helps. Deterministic: ties go to the
lower instance index.
"""

from __future__ import annotations

import heapq

import numpy as np


def lpt(costs: np.ndarray, num_instances: int) -> np.ndarray:
    """Instance index per unit (longest processing time first)."""
    order = np.argsort(-costs, kind="stable")
    heap = [(0.0, k) for k in range(num_instances)]
    assign = np.empty(costs.shape[0], dtype=np.int64)
    c = costs.tolist()
    push, pop = heapq.heappush, heapq.heappop
    for u in order.tolist():
        load, k = pop(heap)
        assign[u] = k
        push(heap, (load + c[u], k))
    return assign


def _best_exchange(ci: np.ndarray, cj: np.ndarray, gap: float) -> tuple[int, int, float]:
    """Best move (b = -1) or swap (a in i, b in j) shrinking a load gap; returns (a, b, delta moved)."""
    best = (-1, -1, 0.0)
    best_score = gap  # the new pair gap |gap - 2*delta|; must get below the current gap
    if ci.size:
        # move: delta = ci[a], best near gap/2
        a = int(np.argmin(np.abs(gap - 2 * ci)))
        score = abs(gap - 2 * ci[a])
        if score < best_score - 1e-12 * max(gap, 1.0):
            best, best_score = (a, -1, float(ci[a])), score
    if ci.size and cj.size:
        order = np.argsort(cj, kind="stable")
        cs = cj[order]
        target = ci - gap / 2  # want cj close to ci - gap/2
        pos = np.clip(np.searchsorted(cs, target), 0, cs.size - 1)
        for cand in (pos, np.maximum(pos - 1, 0)):
            delta = ci - cs[cand]
            score = np.abs(gap - 2 * delta)
            score[delta <= 0] = np.inf
            a = int(np.argmin(score))
            if score[a] < best_score - 1e-12 * max(gap, 1.0):
                best, best_score = (a, int(order[cand[a]]), float(delta[a])), float(score[a])
    return best


def refine(
    costs: np.ndarray, assign: np.ndarray, num_instances: int, max_rounds: int | None = None
) -> np.ndarray:
    """Improve `assign` in place by moves/swaps out of the most loaded instance.

    Bounded by a round count (never by wall time, so the result is deterministic).
    """
    if num_instances < 2 or costs.size < 2:
        return assign
    max_rounds = 4 * num_instances + 64 if max_rounds is None else max_rounds
    loads = np.bincount(assign, weights=costs, minlength=num_instances)
    members = [list(np.flatnonzero(assign == k)) for k in range(num_instances)]
    for _ in range(max_rounds):
        i = int(np.argmax(loads))
        improved = False
        for j in np.argsort(loads, kind="stable").tolist():
            if j == i:
                continue
            gap = float(loads[i] - loads[j])
            if gap <= 1e-12 * max(loads[i], 1.0):
                break
            mi, mj = np.asarray(members[i]), np.asarray(members[j], dtype=np.int64)
            a, b, delta = _best_exchange(costs[mi], costs[mj], gap)
            if a < 0:
                continue
            ua = int(mi[a])
            members[i].remove(ua)
            members[j].append(ua)
            assign[ua] = j
            if b >= 0:
                ub = int(mj[b])
                members[j].remove(ub)
                members[i].append(ub)
                assign[ub] = i
            loads[i] -= delta
            loads[j] += delta
            improved = True
            break
        if not improved:
            break
    return assign


def balance(costs: np.ndarray, num_instances: int) -> np.ndarray:
    """Instance per unit: LPT then refinement."""
    return refine(costs, lpt(costs, num_instances), num_instances)
