"""Advantage estimators beyond GRPO's group normalisation (`rl_config.adv_estimator`), as verl's
`core_algos` defines them, on plain numpy arrays of one trajectory's response tokens.

GRPO's `group_advantages` lives beside the loss (`losses.py`); this module holds the estimators that
need per-token rewards or values: GAE for PPO with a critic.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def gae(token_rewards: Sequence[float], values: Sequence[float], gamma: float = 1.0,
        lam: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation over one trajectory's response tokens (verl's
    `compute_gae_advantage_return`, before whitening): delta_t = r_t + gamma V_{t+1} - V_t (V after
    the last token is 0), A_t = delta_t + gamma lam A_{t+1}; returns (advantages, returns = A + V)."""
    r = np.asarray(token_rewards, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if r.shape != v.shape or r.ndim != 1:
        raise ValueError(f"gae: {r.shape} rewards and {v.shape} values (one of each per response token)")
    adv = np.zeros_like(r)
    last = 0.0
    for t in range(len(r) - 1, -1, -1):
        next_v = v[t + 1] if t + 1 < len(r) else 0.0
        last = r[t] + gamma * next_v - v[t] + gamma * lam * last
        adv[t] = last
    return adv, adv + v


def whiten(rows: Sequence[np.ndarray], eps: float = 1e-8) -> list[np.ndarray]:
    """Every token of every row shifted and scaled by the batch-wide mean and (unbiased) std, verl's
    `masked_whiten` over the response tokens of a minibatch."""
    flat = np.concatenate([np.asarray(r, dtype=np.float64) for r in rows]) if rows else np.zeros(0)
    if flat.size < 2:
        return [np.asarray(r, dtype=np.float64) - flat.mean() if flat.size else np.asarray(r) for r in rows]
    mean, std = flat.mean(), flat.std(ddof=1)
    return [(np.asarray(r, dtype=np.float64) - mean) / (std + eps) for r in rows]
