"""GRPO / DAPO policy losses with off-policy correction for bounded-lag asynchronous training.

Three policies appear per token (decoupled PPO, as in AReaL):
- behaviour `pi_b`: the (possibly stale) weights the rollout instance sampled with (vLLM logprobs);
- proximal `pi_prox`: the current trainer weights *before* this update (the PPO trust-region anchor);
- `pi_theta`: the weights being optimised.
Per response token (docs/loss.md writes it out beside verl's and MindSpeed-RL's option names):

    r  = exp(clamp(log pi_theta - log pi_prox, -20, 20))
    pg = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), and min(pg, -A c) where A < 0 (dual clip)
    w  = min(exp(clamp(log pi_prox - log pi_b, -20, 20)), cap)          (truncated importance weight)
    l  = w pg + beta KL(theta || ref) - entropy_coeff H(pi_theta)

`pi_b` is per token: under partial rollout one sample's tokens come from several weights versions
(`Trajectory.version_changes`), and every token is corrected against its own behaviour policy.
The per-token losses are aggregated over the whole minibatch (verl's `loss_agg_mode`), with the
minibatch's own token and sequence counts (`AggNorm`) as the denominators, so the result does not
depend on how the minibatch is cut into micro-batches, data-parallel or context-parallel shards.

Every input is zeroed at masked (prompt, padding) positions *before* any non-linearity: a junk
value there can never reach `exp`, and the gradient at those positions is exactly 0 instead of
`0 * inf = NaN`. Log-ratios are clamped to [-20, 20] before `exp`, as verl and MindSpeed-RL do.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

KL_PENALTIES = ("low_var_kl", "kl", "mse", "abs", "k1", "k2", "k3")  # verl's names (k1/k2/k3 aliases)
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_CTRL_TYPES = ("fixed", "adaptive")
LOG_RATIO_BOUND = 20.0  # verl / MindSpeed-RL clamp every log-ratio to +-20 before exp
STAT_KEYS = ("loss", "pg_loss", "kl", "kl_seq", "entropy", "clipped", "clipped_lower", "iw_sum",
             "iw_truncated", "tokens")


@dataclass(frozen=True)
class LossConfig:
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28  # DAPO clip-higher (asymmetric); = low for plain PPO/GRPO
    clip_ratio_c: float = 3.0  # dual-clip bound for A < 0 (verl's default); 0 = off (MindSpeed-RL)
    kl_coef: float = 0.0  # initial KL coefficient (the controller may adapt it)
    kl_penalty: str = "low_var_kl"
    use_kl_in_reward: bool = False  # KL subtracted from the reward before advantages, not in the loss
    entropy_coeff: float = 0.0  # l -= entropy_coeff * H: a positive value rewards exploration
    loss_agg_mode: str = "token-mean"
    importance_cap: float = 2.0  # 0: no off-policy correction (w = 1)
    temperature: float = 1.0  # logits are divided by it, as in the rollout's processed logprobs


@dataclass(frozen=True)
class AggNorm:
    """The minibatch totals the aggregation divides by: response tokens, sequences, and verl's
    `loss_scale_factor` (the constant length `seq-mean-token-sum-norm` divides each sequence sum by)."""

    tokens: float
    seqs: float
    scale: float = 1.0


def row_weights(resp_len: torch.Tensor, mode: str, norm: AggNorm) -> torch.Tensor:
    """Weight of every response token of each row [b] so that the weighted sum over the minibatch is
    verl's `agg_loss` of the whole minibatch in one piece (padding rows, `resp_len` 0, weigh 0)."""
    n = resp_len.to(torch.float64)
    live = n > 0
    if mode == "token-mean":
        w = torch.full_like(n, 1.0 / norm.tokens)
    elif mode == "seq-mean-token-sum":
        w = torch.full_like(n, 1.0 / norm.seqs)
    elif mode == "seq-mean-token-mean":
        w = 1.0 / (norm.seqs * torch.where(live, n, torch.ones_like(n)))
    elif mode == "seq-mean-token-sum-norm":
        w = torch.full_like(n, 1.0 / (norm.seqs * norm.scale))
    else:
        raise ValueError(f"unknown loss_agg_mode '{mode}' (one of {', '.join(LOSS_AGG_MODES)})")
    return torch.where(live, w, torch.zeros_like(w))


def group_advantages(rewards: Sequence[float], group_ids: Sequence[Hashable], eps: float = 1e-6,
                     norm_by_std: bool = True) -> np.ndarray:
    """GRPO: (r - mean of its group) / (std of its group + eps), unbiased std, as verl's
    `compute_grpo_outcome_advantage`: a group of one has mean 0 and std 1 (its advantage is its
    reward); `norm_by_std=False` is Dr.GRPO's r - mean (verl's `norm_adv_by_std_in_grpo`)."""
    r = np.asarray(rewards, dtype=np.float64)
    adv = np.zeros_like(r)
    groups: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    for idx in groups.values():
        x = r[idx]
        mean, std = (x.mean(), x.std(ddof=1)) if len(idx) > 1 else (0.0, 1.0)
        adv[idx] = (x - mean) / (std + eps) if norm_by_std else x - mean
    return adv


def equal_reward_groups(rewards: Sequence[float], group_ids: Sequence[Hashable]) -> set[Hashable]:
    """Groups whose rewards are all equal (zero advantage, no signal): DAPO dynamic sampling drops them."""
    seen: dict[Hashable, set[float]] = {}
    for r, g in zip(rewards, group_ids, strict=True):
        seen.setdefault(g, set()).add(float(r))
    return {g for g, vals in seen.items() if len(vals) == 1}


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) (Schulman's k1 / k2 / k3, verl's names): finite with
    a finite gradient for any finite input, since the k3 log-ratio is clamped to +-20 before `exp`."""
    d = ref_logp - logp
    if kind in ("low_var_kl", "k3"):
        d = torch.clamp(d, min=-LOG_RATIO_BOUND, max=LOG_RATIO_BOUND)
        return torch.clamp(torch.exp(d) - d - 1.0, min=-10.0, max=10.0)
    if kind in ("kl", "k1"):
        return -d
    if kind == "abs":
        return d.abs()
    if kind in ("mse", "k2"):
        return 0.5 * d * d
    raise ValueError(f"unknown kl_penalty '{kind}' (one of {', '.join(KL_PENALTIES)})")


def vocab_parallel_entropy(logits: torch.Tensor, pad_from: int | None = None,
                           sum_over_tp: Callable[[torch.Tensor], torch.Tensor] | None = None,
                           max_over_tp: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Entropy [b, s] of softmax over the whole vocabulary from this rank's shard [b, s, V/TP]:
    H = m + log S - B / S with S = sum exp(z - m), B = sum z exp(z - m), the two sums all-reduced
    over tensor parallelism by `sum_over_tp` (megatron's reduce_from_tensor_model_parallel_region:
    all-reduce forward, identity backward) and the max `m` by `max_over_tp` (no gradient). Columns
    from `pad_from` on are vocabulary padding and count for nothing (zeroed before `exp`)."""
    z = logits.float()
    if pad_from is not None:
        valid = torch.arange(z.shape[-1], device=z.device) < pad_from
        z = torch.where(valid, z, torch.zeros_like(z))
        m = torch.where(valid, z.detach(), torch.full_like(z, -torch.inf)).amax(-1, keepdim=True)
    else:
        m = z.detach().amax(-1, keepdim=True)
    if max_over_tp is not None:
        m = max_over_tp(m)
    e = torch.exp(z - m)
    if pad_from is not None:
        e = torch.where(valid, e, torch.zeros_like(e))
    s, b = e.sum(-1), (e * z).sum(-1)
    if sum_over_tp is not None:
        s, b = sum_over_tp(s), sum_over_tp(b)
    return m.squeeze(-1) + torch.log(s) - b / s


@dataclass
class KLController:
    """The KL coefficient, fixed or adapted (Ziegler et al. 2019, verl's / MindSpeed-RL's
    AdaptiveKLController): after each update `value *= 1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon`,
    `kl` the minibatch's mean over sequences of the per-token KL at the proximal policy and `n` its
    number of sequences."""

    value: float
    kind: str = "fixed"
    target: float = 0.1
    horizon: float = 10000.0

    def update(self, current_kl: float, n_steps: int) -> float:
        if self.kind == "adaptive":
            err = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
            self.value *= 1.0 + err * n_steps / self.horizon
        return self.value


def _masked(x: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """x where the mask is on, 0 elsewhere: applied before any non-linearity, so nothing at a masked
    position reaches `exp` and the gradient there is exactly 0."""
    return torch.where(on, x, torch.zeros_like(x))


def _pg_terms(logp: torch.Tensor, prox: torch.Tensor, adv: torch.Tensor, cfg: LossConfig
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clipped (and dual-clipped) surrogate per token; also where the clip and the dual clip bind."""
    ratio = torch.exp(torch.clamp(logp - prox, min=-LOG_RATIO_BOUND, max=LOG_RATIO_BOUND))
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    pg = torch.maximum(pg1, pg2)
    lower = torch.zeros_like(pg, dtype=torch.bool)
    if cfg.clip_ratio_c > 0:
        pg3 = -adv * cfg.clip_ratio_c
        lower = (adv < 0) & (pg > pg3)
        pg = torch.where(adv < 0, torch.minimum(pg, pg3), pg)
    return pg, pg2 > pg1, lower


def policy_loss(logp: torch.Tensor, prox_logp: torch.Tensor, behav_logp: torch.Tensor, adv: torch.Tensor,
                mask: torch.Tensor, cfg: LossConfig, norm: float | AggNorm = 1.0,
                ref_logp: torch.Tensor | None = None, resp_len: torch.Tensor | None = None,
                entropy: torch.Tensor | None = None, kl_coef: float | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Decoupled-PPO loss of one micro-batch, already aggregated over the minibatch.

    All tensors are [batch, seq] aligned on response tokens (`mask` 1 there, 0 elsewhere). `norm` is a
    float (every token divided by it: token-mean over that many tokens) or the minibatch's `AggNorm`
    with `resp_len` [batch] (each row's whole response length, for `cfg.loss_agg_mode`). `kl_coef`
    overrides `cfg.kl_coef` (the controller's current value). Returns the loss (backprop through it)
    and detached *sums* (to be added over micro-batches and ranks) plus the importance-weight max/min.
    """
    on = mask > 0
    m = on.to(logp.dtype)
    logp = _masked(logp, on)
    prox = _masked(prox_logp.detach(), on)
    adv = _masked(adv.to(logp.dtype), on)
    pg, clipped, lower = _pg_terms(logp, prox, adv, cfg)
    raw_iw = torch.exp(torch.clamp(prox - _masked(behav_logp.detach(), on), min=-LOG_RATIO_BOUND,
                                   max=LOG_RATIO_BOUND))
    iw = torch.clamp(raw_iw, max=cfg.importance_cap) if cfg.importance_cap > 0 else torch.ones_like(raw_iw)
    per_token = iw * pg
    kl = torch.zeros_like(logp)
    beta = cfg.kl_coef if kl_coef is None else kl_coef
    if ref_logp is not None:
        kl = kl_penalty(logp, _masked(ref_logp.detach().to(logp.dtype), on), cfg.kl_penalty)
        if beta > 0 and not cfg.use_kl_in_reward:
            per_token = per_token + beta * kl
    ent = torch.zeros_like(logp) if entropy is None else _masked(entropy.to(logp.dtype), on)
    if entropy is not None and cfg.entropy_coeff != 0:
        per_token = per_token - cfg.entropy_coeff * ent
    if isinstance(norm, AggNorm):
        if resp_len is None:
            raise ValueError("policy_loss: an AggNorm needs resp_len (each row's response length)")
        weight = m * row_weights(resp_len, cfg.loss_agg_mode, norm).to(logp.dtype).unsqueeze(-1)
    else:
        weight = m / norm
    loss = (per_token * weight).sum()
    return loss, _stats(loss, iw * pg * weight, kl * m, ent * m, clipped & on, lower & on, raw_iw, on, cfg,
                        resp_len)


def _stats(loss: torch.Tensor, pg: torch.Tensor, kl: torch.Tensor, ent: torch.Tensor, clipped: torch.Tensor,
           lower: torch.Tensor, raw_iw: torch.Tensor, on: torch.Tensor, cfg: LossConfig,
           resp_len: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Detached sums of one micro-batch (`kl_seq`: sum over rows of a row's KL / its response length,
    the controller's per-sequence mean once divided by the sequence count)."""
    m = on.to(raw_iw.dtype)
    big = torch.finfo(raw_iw.dtype).max
    kl_seq = torch.zeros((), dtype=kl.dtype)
    if resp_len is not None:
        n = resp_len.to(kl.dtype)
        kl_seq = torch.where(n > 0, kl.detach().sum(-1) / torch.clamp(n, min=1.0), torch.zeros_like(n)).sum()
    truncated = (raw_iw > cfg.importance_cap) & on if cfg.importance_cap > 0 else torch.zeros_like(on)
    return {
        "loss": loss.detach(), "pg_loss": pg.sum().detach(), "kl": kl.sum().detach(), "kl_seq": kl_seq,
        "entropy": ent.sum().detach(), "clipped": clipped.sum().to(m.dtype),
        "clipped_lower": lower.sum().to(m.dtype), "iw_sum": (raw_iw * m).sum().detach(),
        "iw_truncated": truncated.sum().to(m.dtype), "tokens": m.sum(),
        "iw_max": torch.where(on, raw_iw, torch.full_like(raw_iw, -big)).max().detach(),
        "iw_min": torch.where(on, raw_iw, torch.full_like(raw_iw, big)).min().detach(),
    }


def token_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL [b, s], 0 where `mask` is 0 (verl's `apply_kl_penalty`: `kld * response_mask`, the
    token-level penalty of the reward)."""
    on = mask > 0
    return kl_penalty(_masked(logp, on), _masked(ref_logp, on), kind) * on.to(logp.dtype)


def sequence_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, kind: str) -> torch.Tensor:
    """Each row's summed per-token KL over its response tokens [b] (the penalty an outcome-reward
    estimator sums into the sequence's reward)."""
    return token_kl(logp, ref_logp, mask, kind).sum(-1)
