"""Padding: cut length-sorted groups into length-homogeneous units, so a unit's samples end together.

Everyone in a batch waits for its longest sample; with groups sorted by predicted length and cut
into contiguous chunks of equal size, the sum of per-unit maxima is minimal. The unit size is `c`
groups where `c*G` divides the minibatch M (so admission under the lag rule can never deadlock, see
`planner`), `c*G <= min(M, max_num_seqs)` (a unit fits the instance's slots and one trainer step),
and small enough that every instance gets at least one unit when there are that many groups.
"""

from __future__ import annotations

import numpy as np


def groups_per_unit(
    minibatch: int, group_size: int, max_num_seqs: int, num_groups: int, num_instances: int
) -> int:
    """The unit size `c` in groups (>= 1)."""
    per_mb = minibatch // group_size
    cap = max(1, min(minibatch, max_num_seqs) // group_size)
    if num_groups >= num_instances:
        cap = min(cap, max(1, num_groups // num_instances))
    return max(d for d in divisors(per_mb) if d <= cap)


def divisors(x: int) -> list[int]:
    """Every divisor of `x` >= 1 (trial division to sqrt(x): fast even for a minibatch near 2^31)."""
    small = [d for d in range(1, int(x**0.5) + 1) if x % d == 0]
    return small + [x // d for d in reversed(small) if d * d != x]


def length_order(key: np.ndarray, seed: int) -> np.ndarray:
    """Group indices by descending `key`; ties broken by a seeded shuffle (deterministic per seed)."""
    rng = np.random.default_rng(seed)
    jitter = rng.permutation(key.shape[0])
    order: np.ndarray = np.lexsort((jitter, -key))
    return order


def cut_units(order: np.ndarray, per_unit: int) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous chunks of `per_unit` groups of `order`: (group ids in unit order, unit offsets).

    The last unit holds the remainder and is the smallest (the shortest groups when `order` is
    descending).
    """
    n = order.shape[0]
    offsets = np.r_[np.arange(0, n, per_unit), n].astype(np.int64)
    return order, offsets


def intra_unit_spread(lengths: np.ndarray, unit_offsets: np.ndarray) -> np.ndarray:
    """Per unit `(max - mean) / max` of the sample lengths it holds (padding waste of that batch)."""
    sizes = np.diff(unit_offsets)
    nonempty = sizes > 0
    starts = unit_offsets[:-1][nonempty]
    mx = np.maximum.reduceat(lengths, starts)
    mean = np.add.reduceat(lengths.astype(np.float64), starts) / sizes[nonempty]
    spread: np.ndarray = (mx - mean) / mx
    return spread
