"""Sorting: order each instance's units so the merged completion stream reaches the trainer evenly.

Length-sorted dispatch delivers every short sample first (a burst that overflows the queue and the
lag bound) and then starves the trainer during the long tail. Instead each instance follows the line
`completed_samples(t) = N_k * t / D_k` (its samples over its predicted busy time): greedily, the next
unit is the one whose completion lands closest to that line -- a short unit when the instance is
behind, a long one when it is ahead. Every instance tracking a straight line makes the merged stream
straight too, at the pace of the balanced makespan; the lag rule (planner) then caps it at the
trainer's pace. O(m log m) per instance with a "next unused" union-find over the sorted durations.

Under a tight lag bound instances must also move in step (the trainer waits for every unit due at a
step), so `aligned_orders` makes all instances follow one template of duration ranks: "smooth"
(the line above, wave by wave) or "descending" (longest waves first). The planner times each of
`ORDERINGS` under the lag rule and keeps the best; which wins depends on max_lag and trainer pace.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np


def _find(parent: list[int], x: int) -> int:
    root = x
    while parent[root] != root:
        root = parent[root]
    while parent[x] != root:
        parent[x], x = root, parent[x]
    return root


def smooth_order(durations: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Permutation of units (indices into the inputs) tracking a constant completion rate."""
    m = int(durations.shape[0])
    if m <= 1:
        return np.arange(m)
    srt = np.argsort(durations, kind="stable")
    ds = durations[srt].tolist()
    ns = sizes[srt].tolist()
    total_d, total_n = float(sum(ds)), float(sum(ns))
    rate = total_n / total_d if total_d > 0 else 0.0
    nbar = total_n / m
    right = list(range(m + 1))  # right[i]: smallest unused index >= i (m: none)
    left = list(range(m + 1))  # left[i + 1]: largest unused index <= i, shifted by one (0: none)
    out = np.empty(m, dtype=np.int64)
    t = c = 0.0
    for step in range(m):
        target = (c + nbar) / rate - t if rate > 0 else 0.0
        i = bisect_left(ds, target)
        r = _find(right, min(i, m))
        lft = _find(left, min(i, m)) - 1  # unused index <= i - 1
        best, best_dev = -1, float("inf")
        for x in (r, lft):
            if 0 <= x < m:
                dev = abs(c + ns[x] - rate * (t + ds[x]))
                if dev < best_dev or (dev == best_dev and x < best):
                    best, best_dev = x, dev
        right[best] = best + 1
        left[best + 1] = best
        t += ds[best]
        c += ns[best]
        out[step] = srt[best]
    return out


def completion_curve(
    durations: np.ndarray, sizes: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(finish times, cumulative samples) of running units back to back in `order`."""
    return np.cumsum(durations[order]), np.cumsum(sizes[order])


def max_deviation(durations: np.ndarray, sizes: np.ndarray, order: np.ndarray) -> float:
    """Largest distance (in samples) of the completion curve from the straight line."""
    t, c = completion_curve(durations, sizes, order)
    if t.size == 0 or t[-1] <= 0:
        return 0.0
    return float(np.max(np.abs(c - c[-1] * t / t[-1])))


def aligned_orders(
    durations: list[np.ndarray], sizes: list[np.ndarray], template: str = "smooth"
) -> list[np.ndarray]:
    """Per-instance orders that follow one common smooth template of duration ranks.

    Balanced instances hold similar multisets of unit durations, so the j-th unit of every instance
    is planned to take about as long: units started together finish together. Under a tight lag
    bound (room for about one unit per instance) that keeps every instance admitted, where
    independently smoothed orders would leave fast instances waiting for a minibatch to complete.
    `template`: "smooth" (long and short waves interleaved), "descending" (longest waves first).
    """
    m_max = max((d.size for d in durations), default=0)
    if m_max == 0:
        return [np.arange(0) for _ in durations]
    # template: mean duration/size of each (normalised) rank across instances
    acc_d = np.zeros(m_max)
    acc_n = np.zeros(m_max)
    cnt = np.zeros(m_max)
    ranked = []
    for d, n in zip(durations, sizes, strict=True):
        srt = np.argsort(d, kind="stable")
        slot = (np.arange(d.size) * m_max) // max(d.size, 1)
        np.add.at(acc_d, slot, d[srt])
        np.add.at(acc_n, slot, n[srt])
        np.add.at(cnt, slot, 1)
        ranked.append((srt, slot))
    have = cnt > 0
    tmpl_d = np.where(have, acc_d / np.maximum(cnt, 1), 0.0)
    tmpl_n = np.where(have, acc_n / np.maximum(cnt, 1), 0.0)
    idx = np.flatnonzero(have)
    if template == "smooth":
        tmpl = idx[smooth_order(tmpl_d[idx], tmpl_n[idx])]
    elif template == "descending":
        tmpl = idx[::-1]  # slots are duration ranks: longest rank first on every instance
    else:
        raise ValueError(f"unknown template {template!r}")
    position = np.empty(m_max, dtype=np.int64)
    position[tmpl] = np.arange(tmpl.size)
    out = []
    for srt, slot in ranked:
        out.append(srt[np.lexsort((np.arange(slot.size), position[slot]))])
    return out


ORDERINGS = ("aligned-smooth", "aligned-descending", "smooth")


def instance_orders(name: str, durations: list[np.ndarray], sizes: list[np.ndarray]) -> list[np.ndarray]:
    """Per-instance unit orders of one named strategy (indices into each instance's arrays)."""
    if name == "aligned-smooth":
        return aligned_orders(durations, sizes, "smooth")
    if name == "aligned-descending":
        return aligned_orders(durations, sizes, "descending")
    if name == "smooth":
        return [smooth_order(d, n) for d, n in zip(durations, sizes, strict=True)]
    raise ValueError(f"unknown ordering {name!r} (choose {', '.join(ORDERINGS)})")
