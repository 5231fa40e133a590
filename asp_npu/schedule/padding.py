"""Padding: cut length-sorted groups into length-homogeneous units, so a unit's samples end together.

Everyone in a batch waits for its longest sample; with groups sorted by predicted length and cut
into contiguous chunks of equal size, the sum of per-unit maxima is minimal. The unit size is `c`
groups where `c*G` divides the minibatch M (so admission under the lag rule can never deadlock, see
`planner`), `c*G <= min(M, max_num_seqs)` (a unit fits the instance's slots and one trainer step),
small enough that every instance gets at least `ROWS` units when there are that many groups (the
skewness step deals whole rows of K units; with fewer rows the loads cannot be evened out).
"""

from __future__ import annotations

import numpy as np

ROWS = 4  # units per instance the unit size leaves room for, when there are enough groups


def groups_per_unit(
    minibatch: int, group_size: int, max_num_seqs: int, num_groups: int, num_instances: int
) -> int:
    """The unit size `c` in groups (>= 1)."""
    per_mb = minibatch // group_size
    cap = max(1, min(minibatch, max_num_seqs) // group_size)
    if num_groups >= num_instances:
        cap = min(cap, max(1, num_groups // (ROWS * num_instances)))
    return max(d for d in range(1, per_mb + 1) if per_mb % d == 0 and d <= cap)


def length_order(key: np.ndarray, seed: int) -> np.ndarray:
    """Group indices by descending `key`; ties broken by a seeded shuffle (deterministic per seed)."""
    rng = np.random.default_rng(seed)
    jitter = rng.permutation(key.shape[0])
    return np.lexsort((jitter, -key))


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
    return (mx - mean) / mx
