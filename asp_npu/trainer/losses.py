"""GRPO / DAPO policy losses with off-policy correction for bounded-lag asynchronous training.

Three policies appear per token (decoupled PPO, as in AReaL):
- behaviour `pi_b`: the (possibly stale) weights the rollout instance sampled with (vLLM logprobs);
- proximal `pi_prox`: the current trainer weights *before* this update (the PPO trust-region anchor);
- `pi_theta`: the weights being optimised.
Loss per response token: `w * max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) + beta * KL(theta || ref)`
with `r = pi_theta / pi_prox` and the truncated importance weight `w = min(pi_prox / pi_b, cap)`, which
corrects for the policy lag. `pi_b` is per token: under partial rollout one sample's tokens come from
several weights versions (`Trajectory.version_changes`), and its behaviour logprobs are the ones vLLM
returned as each token was sampled, so every token is corrected against its own behaviour policy.
Aggregation is token-level over the whole minibatch (DAPO), so the
result does not depend on how the minibatch is cut into micro-batches or data-parallel shards.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

KL_PENALTIES = ("low_var_kl", "kl", "mse")
STAT_KEYS = ("loss", "pg_loss", "kl", "clipped", "iw_sum", "iw_truncated", "tokens")


@dataclass(frozen=True)
class LossConfig:
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28  # DAPO clip-higher (asymmetric); = low for plain PPO/GRPO
    kl_coef: float = 0.0
    kl_penalty: str = "low_var_kl"
    importance_cap: float = 2.0  # <= 0: no off-policy correction (w = 1)
    temperature: float = 1.0  # logits are divided by it, as in the rollout's processed logprobs


def group_advantages(rewards: Sequence[float], group_ids: Sequence[Hashable],
                     eps: float = 1e-6) -> np.ndarray:
    """GRPO: (r - mean of its group) / (std of its group + eps); unbiased std, as verl/MindSpeed-RL."""
    r = np.asarray(rewards, dtype=np.float64)
    adv = np.zeros_like(r)
    groups: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    for idx in groups.values():
        x = r[idx]
        std = x.std(ddof=1) if len(idx) > 1 else 0.0
        adv[idx] = (x - x.mean()) / (std + eps)
    return adv


def equal_reward_groups(rewards: Sequence[float], group_ids: Sequence[Hashable]) -> set[Hashable]:
    """Groups whose rewards are all equal (zero advantage, no signal): DAPO dynamic sampling drops them."""
    seen: dict[Hashable, set[float]] = {}
    for r, g in zip(rewards, group_ids, strict=True):
        seen.setdefault(g, set()).add(float(r))
    return {g for g, vals in seen.items() if len(vals) == 1}


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate of pi_theta from pi_ref (Schulman's k1/k2/k3; k3 = low_var_kl, clamped)."""
    d = ref_logp - logp
    if kind == "low_var_kl":
        return torch.clamp(torch.exp(d) - d - 1.0, min=-10.0, max=10.0)
    if kind == "kl":
        return -d
    if kind == "mse":
        return 0.5 * d * d
    raise ValueError(f"unknown kl_penalty '{kind}' (one of {', '.join(KL_PENALTIES)})")


def policy_loss(logp: torch.Tensor, prox_logp: torch.Tensor, behav_logp: torch.Tensor, adv: torch.Tensor,
                mask: torch.Tensor, cfg: LossConfig, norm: float,
                ref_logp: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level decoupled-PPO loss of one micro-batch, already divided by `norm` (minibatch tokens).

    All tensors are [batch, seq] aligned on response tokens (`mask` 1 there, 0 elsewhere). Returns the
    loss (backprop through it) and detached *sums* (to be added over micro-batches and ranks) plus
    the importance-weight max/min.
    """
    mask = mask.to(logp.dtype)
    prox = prox_logp.detach()
    ratio = torch.exp(logp - prox)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    pg = torch.maximum(pg1, pg2)
    raw_iw = torch.exp(prox - behav_logp.detach())
    if cfg.importance_cap > 0:
        iw = torch.clamp(raw_iw, max=cfg.importance_cap)
    else:
        iw = torch.ones_like(raw_iw)
    per_token = iw * pg
    kl = torch.zeros_like(logp)
    if ref_logp is not None and cfg.kl_coef > 0:
        kl = kl_penalty(logp, ref_logp.detach(), cfg.kl_penalty)
        per_token = per_token + cfg.kl_coef * kl
    loss = (per_token * mask).sum() / norm
    on = mask > 0
    big = torch.finfo(raw_iw.dtype).max
    stats = {
        "loss": loss.detach(),
        "pg_loss": ((iw * pg * mask).sum() / norm).detach(),
        "kl": (kl * mask).sum().detach(),
        "clipped": ((pg2 > pg1) & on).sum().to(logp.dtype),
        "iw_sum": (raw_iw * mask).sum().detach(),
        "iw_truncated": ((raw_iw > cfg.importance_cap) & on).sum().to(logp.dtype)
        if cfg.importance_cap > 0 else torch.zeros((), dtype=logp.dtype),
        "tokens": mask.sum(),
        "iw_max": torch.where(on, raw_iw, torch.full_like(raw_iw, -big)).max().detach(),
        "iw_min": torch.where(on, raw_iw, torch.full_like(raw_iw, big)).min().detach(),
    }
    return loss, stats
