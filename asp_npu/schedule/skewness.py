"""Skewness: place groups and units on instances so every instance gets the same predicted token load.

Balanced on predicted tokens (what a continuous-batching engine's busy time follows, and what
Karmarkar-Karp balances in verl's `get_seqlen_balanced_partitions`, which `baselines.karmarkar_karp`
reimplements as the reference), in three steps the planner (`planner.skewed_units`) chains:
1. `deal`: groups ranked by predicted length, in rows of K, one per instance (the heaviest of a row to
   the least-loaded instance): every instance holds the same mix of lengths, so also the same share
   of the long tail whose prediction errors are largest; each instance then cuts its groups in rank
   order into units (length-homogeneous: a unit spans K*c consecutive ranks);
2. `lpt` (+ `refine` when nothing could be dealt): the units left over, longest first onto the
   least-loaded instance; `refine` moves or swaps whole units between the most and a less loaded one;
3. `polish`: below unit granularity, swap single *groups* between instances, only between groups
   whose length ranks are within `window` of each other, so a unit keeps groups of neighbouring
   lengths (its rank band widens by at most `window` on each side: padding is kept) while the load
   moves in steps as fine as two neighbouring groups differ.
Where whole units are too coarse for that (a unit alone above the mean load, or a group count per
instance that is no multiple of the unit), the planner re-cuts (`planner.recut_units`): `bands`
pours the left-over ranks onto the dealt loads up to a common level (`water_level`), one band of
consecutive ranks per instance, and `even_cuts` cuts each band into as few and as even units as fit.
Dealing keeps any two loads within the largest group, `lpt` within the largest unit, and `refine` and
`polish` only ever lower the larger of two loads (never below the smaller); a re-cut is kept only
within its largest unit: the spread of the final loads is at most the largest unit
(tests/schedule/test_properties.py). Deterministic; bounded by round counts, never by wall time.
"""

from __future__ import annotations

import heapq

import numpy as np


def lpt(costs: np.ndarray, num_instances: int, loads: np.ndarray | None = None) -> np.ndarray:
    """Instance index per unit (longest processing time first), on top of `loads` if given."""
    order = np.argsort(-costs, kind="stable")
    start = [0.0] * num_instances if loads is None else [float(x) for x in loads]
    heap = [(start[k], k) for k in range(num_instances)]
    heapq.heapify(heap)
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
    by_inst = np.argsort(assign, kind="stable")
    cuts = np.searchsorted(assign[by_inst], np.arange(1, num_instances))
    members = [list(m) for m in np.split(by_inst, cuts)]
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


def deal(weights_desc: np.ndarray, num_instances: int, per_unit: int) -> tuple[np.ndarray, int]:
    """Instance per rank for the first `full` ranks of a descending load list, and `full`.

    Rows of `num_instances` consecutive ranks (groups of nearly equal predicted length) are dealt one
    per instance, the heaviest of a row to the least-loaded instance, for as many whole rows as give
    every instance whole units (`full` = a multiple of `num_instances * per_unit`). Every instance
    then holds the same mix of lengths: the same share of the long tail, whose prediction errors are
    the largest, so the loads also agree on the actual lengths.
    """
    k = num_instances
    full = (weights_desc.shape[0] // (k * per_unit)) * k * per_unit
    inst = np.empty(full, dtype=np.int64)
    loads = np.zeros(k)
    rows = np.asarray(weights_desc[:full], dtype=np.float64).reshape(-1, k)
    for r in range(rows.shape[0]):
        ks = np.argsort(loads, kind="stable")  # least loaded first; the row is heaviest first
        inst[r * k : (r + 1) * k] = ks
        loads[ks] += rows[r]
    return inst, full


def polish(
    weights: np.ndarray,
    group_at: np.ndarray,
    inst_at: np.ndarray,
    rank: np.ndarray,
    num_instances: int,
    window: int,
    max_rounds: int | None = None,
    tol: float = 1e-6,
) -> np.ndarray:
    """Swap groups between instances to even out their loads; returns the new `group_at` (a copy).

    `group_at[p]`: group at position p of the unit layout (units are contiguous position ranges, so a
    position's instance `inst_at[p]` is fixed); `weights[g]`, `rank[g]`: group g's load and its rank
    by predicted length (0 = longest). A swap of positions p (instance i, the most loaded) and q
    (instance j) is allowed only when each group lands within `window` ranks of the group that held
    that position at the start (so a unit's rank band widens by at most `window` on each side), and
    taken when it lowers max(load_i, load_j): the swap that lowers it most, over every j, each round.
    """
    n = int(group_at.shape[0])
    out = np.asarray(group_at, dtype=np.int64).copy()
    if num_instances < 2 or n < 2 or window < 1:
        return out
    window = min(window, n - 1)  # farther ranks do not exist
    w = np.asarray(weights, dtype=np.float64)
    rank = np.asarray(rank, dtype=np.int64)
    home = rank[out]  # position -> rank of the group it held at the start
    pos_of_home = np.empty(n, dtype=np.int64)
    pos_of_home[home] = np.arange(n)
    inst = np.asarray(inst_at, dtype=np.int64)
    loads = np.bincount(inst, weights=w[out], minlength=num_instances)
    by_inst = np.argsort(inst, kind="stable")
    members = np.split(by_inst, np.searchsorted(inst[by_inst], np.arange(1, num_instances)))
    max_rounds = 32 * num_instances + 256 if max_rounds is None else max_rounds
    offs = np.r_[np.arange(-window, 0), np.arange(1, window + 1)]
    for _ in range(max_rounds):
        i = int(np.argmax(loads))
        mean = float(loads.mean())
        if mean <= 0 or loads[i] <= mean * (1 + tol):
            break
        p = members[i]
        gp = out[p]
        r = rank[gp][:, None] + offs[None, :]  # gp would go where the group of rank r started
        ok = (r >= 0) & (r < n)
        qs = pos_of_home[np.where(ok, r, 0)]
        j = inst[qs]
        gq = out[qs]
        ok &= (j != i) & (np.abs(rank[gq] - home[p][:, None]) <= window)
        delta = w[gp][:, None] - w[gq]
        gain = np.where(ok, np.minimum(delta, loads[i] - loads[j] - delta), 0.0)  # fall of max(i, j)
        a = int(np.argmax(gain))
        if gain.flat[a] <= 1e-12 * mean:
            break
        row, col = divmod(a, offs.size)
        pa, qa, jj, d = int(p[row]), int(qs[row, col]), int(j[row, col]), float(delta[row, col])
        out[pa], out[qa] = out[qa], out[pa]
        loads[i] -= d
        loads[jj] += d
    return out




def water_level(loads: np.ndarray, mass: float) -> float:
    """The level `mu` with `sum(max(0, mu - loads)) == mass`: `mass` poured onto the lowest loads."""
    srt = np.sort(np.asarray(loads, dtype=np.float64))
    csum = np.cumsum(srt)
    for m in range(srt.size, 0, -1):  # the m lowest loads end below the level
        mu = (mass + csum[m - 1]) / m
        if mu >= srt[m - 1]:
            return float(mu)
    return float(srt[0] + mass)  # not reached for mass >= 0 (m = 1 always qualifies)


def bands(weights_desc: np.ndarray, loads: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut a descending load list into consecutive rank bands, one per instance: (lo, hi, instance).

    The list is poured on top of `loads` up to their common level (`water_level`): every instance
    below it takes one band worth its gap, instances in index order. Each cut sits at the group
    boundary nearest to the running sum of the gaps, so rounding never accumulates: an instance ends
    within a group of the level at either end of its band. Bands are consecutive ranks (length-
    homogeneous); empty ones are left out.
    """
    w = np.asarray(weights_desc, dtype=np.float64)
    base = np.asarray(loads, dtype=np.float64)
    n = int(w.shape[0])
    empty = np.zeros(0, dtype=np.int64)
    if n == 0 or base.size == 0:
        return empty, empty, empty
    prefix = np.r_[0.0, np.cumsum(w)]
    gap = np.maximum(0.0, water_level(base, float(prefix[-1])) - base)
    takers = np.flatnonzero(gap > 0)
    if takers.size == 0:  # nothing to pour (zero weights): one band to the least loaded
        return np.array([0]), np.array([n]), np.array([int(np.argmin(base))], dtype=np.int64)
    target = np.cumsum(gap[takers])
    hi = np.clip(np.searchsorted(prefix, target), 1, n)  # prefix[hi] >= target
    hi = hi - (np.abs(prefix[hi - 1] - target) < np.abs(prefix[hi] - target))
    hi[-1] = n
    hi = np.maximum.accumulate(hi)
    lo = np.r_[0, hi[:-1]]
    keep = hi > lo
    return lo[keep].astype(np.int64), hi[keep].astype(np.int64), takers[keep].astype(np.int64)


def even_cuts(lo: np.ndarray, hi: np.ndarray, per_unit: int) -> tuple[np.ndarray, np.ndarray]:
    """Units of at most `per_unit` ranks cut from each band [lo, hi), as few and as even as possible:
    (unit start offsets, band index per unit)."""
    size = hi - lo
    count = -(-size // per_unit)
    band = np.repeat(np.arange(size.size), count)
    j = np.arange(band.size) - np.repeat(np.cumsum(count) - count, count)  # unit index within its band
    starts = lo[band] + (j * size[band]) // count[band]
    return starts.astype(np.int64), band
