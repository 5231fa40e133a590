"""Advantage estimators beyond GRPO's group normalisation (`rl_config.adv_estimator`), as verl's
`core_algos` defines them, on plain numpy arrays of one trajectory's response tokens.

GRPO's `group_advantages` lives beside the loss (`losses.py`); this module holds GAE for PPO with a
critic and the critic-free estimators (rloo, reinforce_plus_plus, reinforce_plus_plus_baseline, remax,
gpg; docs/loss.md). `batching.batch_advantages` chooses among them.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

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


# ------------------------------------------------------------------ critic-free estimators (verl's)
# Outcome estimators take one score per sample (its reward, less any KL penalty in the reward: verl
# sums a sequence's token-level rewards) and the group of each sample (prompt, epoch); a group of one
# has baseline 0, as in verl. Token-level ones take each sample's per-response-token rewards.

Floats = Sequence[float] | np.ndarray


def _groups(group_ids: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    out: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        out.setdefault(g, []).append(i)
    return out


def rloo(scores: Floats, group_ids: Sequence[Hashable]) -> np.ndarray:
    """RLOO (verl `rloo`): A_i = r_i - mean of the *other* samples of its group
    = n / (n - 1) (r_i - mean_g); a group of one keeps its score."""
    r = np.asarray(scores, dtype=np.float64)
    adv = r.copy()
    for idx in _groups(group_ids).values():
        n = len(idx)
        if n > 1:
            x = r[idx]
            adv[idx] = (x * n - x.sum()) / (n - 1)
    return adv


def group_baseline(scores: Floats, group_ids: Sequence[Hashable]) -> np.ndarray:
    """r_i - mean of its group (mean 0 for a group of one): the baseline of REINFORCE++-baseline and GPG."""
    r = np.asarray(scores, dtype=np.float64)
    adv = r.copy()
    for idx in _groups(group_ids).values():
        if len(idx) > 1:
            adv[idx] = r[idx] - r[idx].mean()
    return adv


def token_weighted_whiten(values: Floats, tokens: Sequence[int]) -> np.ndarray:
    """Whiten one value per sample as if broadcast over its `tokens` trained response tokens (verl's
    `masked_whiten` of a per-sequence value tiled over the response mask): mean and unbiased variance
    over all those tokens; a sample with no trained token gets 0."""
    v = np.asarray(values, dtype=np.float64)
    n = np.asarray(tokens, dtype=np.int64)
    rows = whiten([np.full(int(k), x) for x, k in zip(v, n, strict=True) if k > 0])
    it = iter(rows)
    return np.array([float(next(it)[0]) if k > 0 else 0.0 for k in n], dtype=np.float64)


def reinforce_plus_plus_baseline(scores: Floats, group_ids: Sequence[Hashable],
                                 tokens: Sequence[int]) -> np.ndarray:
    """REINFORCE++-baseline (verl `reinforce_plus_plus_baseline`): r_i - mean_g, then whitened over
    every trained response token of the batch (`tokens` per sample)."""
    return token_weighted_whiten(group_baseline(scores, group_ids), tokens)


def gpg(scores: Floats, group_ids: Sequence[Hashable], f_norm: float = 1.0) -> np.ndarray:
    """GPG (verl `gpg`): alpha (r_i - mean_g) / f_norm, alpha = batch size / samples with a non-zero
    score (at least one): the gradient of the samples with signal rescaled to the whole batch."""
    r = np.asarray(scores, dtype=np.float64)
    alpha = len(r) / max(int(np.count_nonzero(r)), 1)
    return alpha * group_baseline(r, group_ids) / f_norm


def discounted_returns(token_rewards: Floats, gamma: float = 1.0) -> np.ndarray:
    """G_t = r_t + gamma G_{t+1} over one response (G after the last token is 0)."""
    r = np.asarray(token_rewards, dtype=np.float64)
    out = np.zeros_like(r)
    run = 0.0
    for t in range(len(r) - 1, -1, -1):
        run = r[t] + gamma * run
        out[t] = run
    return out


def reinforce_plus_plus(token_rewards: Sequence[Floats], masks: Sequence[Sequence[int]],
                        gamma: float = 1.0) -> list[np.ndarray]:
    """REINFORCE++ (verl `reinforce_plus_plus`): each token's discounted return, whitened over every
    trained token (mask 1) of the batch; untrained tokens get 0. The return runs through untrained
    tokens (a tool's output): verl restarts it at every masked token, which in a multi-turn
    trajectory would cut every earlier turn off from the outcome reward."""
    rets = [discounted_returns(r, gamma) for r in token_rewards]
    on = [np.asarray(m, dtype=bool) for m in masks]
    for r, m in zip(rets, on, strict=True):
        if r.shape != m.shape:
            raise ValueError(f"reinforce_plus_plus: {r.shape} rewards and {m.shape} mask (one per token)")
    white = iter(whiten([r[m] for r, m in zip(rets, on, strict=True)]))
    out = []
    for r, m in zip(rets, on, strict=True):
        a = np.zeros_like(r)
        a[m] = next(white)
        out.append(a)
    return out


def remax(token_rewards: Sequence[Floats], baselines: Floats) -> list[np.ndarray]:
    """ReMax (verl `remax`): each token's undiscounted return minus its prompt's baseline, the reward of
    the greedy response to the same prompt; no whitening. With outcome rewards only: r_i - b."""
    if len(token_rewards) != len(baselines):
        raise ValueError(f"remax: {len(token_rewards)} samples and {len(baselines)} baselines")
    return [discounted_returns(r, 1.0) - b for r, b in zip(token_rewards, baselines, strict=True)]
