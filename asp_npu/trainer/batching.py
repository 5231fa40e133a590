"""A TrainBatch as trainer samples: advantages by `rl_config.adv_estimator` (`batch_advantages`), the
data-parallel shard of each rank (balanced by tokens), and micro-batches (by count, or by a token
budget: verl's use_dynamic_bsz).

Every rank receives the whole TrainBatch and deterministically picks its shard, so the driver never
needs to know the layout; the loss's normalisation (`agg_norm`) counts the whole minibatch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from asp_npu.config import Config, RLConfig
from asp_npu.trainer.advantages import gpg, reinforce_plus_plus, reinforce_plus_plus_baseline, remax, rloo
from asp_npu.trainer.losses import AggNorm, equal_reward_groups, group_advantages
from asp_npu.types import TrainBatch, Trajectory


@dataclass
class Sample:
    """One trajectory as trainer tensors: inputs are tokens[:-1], labels tokens[1:]."""

    index: int  # position in the TrainBatch
    tokens: list[int]
    prompt_len: int
    advantage: float | list[float]  # one per sample (outcome estimators) or one per response token (GAE)
    behaviour: list[float]  # logprobs of the response tokens under the rollout policy
    loss_mask: list[int] | None = None  # per response token, 0 = no loss (a tool's output); None = all 1

    @property
    def length(self) -> int:
        return len(self.tokens) - 1

    @property
    def response_len(self) -> int:
        """Positions that carry loss (mask 1): the response tokens, less those `loss_mask` leaves out."""
        n = self.length - self.prompt_len + 1
        return n if self.loss_mask is None else int(sum(1 for m in self.loss_mask[:n] if m))


def agg_norm(samples: list[Sample], cfg: Config) -> AggNorm:
    """The whole minibatch's response tokens and sequences (each rank sees all samples, so every rank
    and micro-batch divides by the same totals); `loss_scale_factor` 0 = the response cap max_tokens."""
    scale = cfg.rl_config.loss_scale_factor or cfg.generate_config.sampling_config.max_tokens
    return AggNorm(tokens=float(sum(s.response_len for s in samples)), seqs=float(len(samples)),
                   scale=float(scale))


def group_key(t: Trajectory) -> tuple[str, int]:
    return (t.prompt_id, t.epoch)


@dataclass(frozen=True)
class Estimator:
    """How advantages are computed (`rl_config.adv_estimator` and the keys it reads)."""

    name: str = "group_norm"  # one of config.ADV_ESTIMATORS
    norm_by_std: bool = True  # group_norm: norm_adv_by_std_in_grpo
    gamma: float = 1.0  # reinforce_plus_plus: discount

    @classmethod
    def of(cls, rl: RLConfig) -> Estimator:
        return cls(rl.adv_estimator, rl.norm_adv_by_std_in_grpo, rl.gamma)


def _trained(t: Trajectory) -> list[int]:
    return list(t.loss_mask) or [1] * len(t.response_token_ids)


def token_rewards(t: Trajectory, penalty: Sequence[float] | None = None) -> np.ndarray:
    """verl's token-level rewards of one response: its reward on the last token, less the per-token KL
    penalty `beta kl_t` when the KL is in the reward."""
    r = np.zeros(len(t.response_token_ids))
    if len(r):
        r[-1] = t.reward
    if penalty is not None:
        p = np.asarray(penalty, dtype=np.float64)
        if p.shape != r.shape:
            raise ValueError(f"trajectory {t.prompt_id}/{t.sample_idx}: {len(p)} KL penalties for "
                             f"{len(r)} response tokens")
        r = r - p
    return r


def reward_baseline(t: Trajectory) -> float:
    """The reward of the greedy response to the trajectory's prompt (ReMax's baseline)."""
    if t.reward_baseline is None:
        raise ValueError(f"trajectory {t.prompt_id}/{t.sample_idx} has no reward_baseline: adv_estimator "
                         "remax needs the rollout's greedy baseline (SamplingSettings.greedy_baseline)")
    return t.reward_baseline


def batch_advantages(batch: TrainBatch, est: Estimator | None = None,
                     penalties: Mapping[int, Sequence[float]] | None = None) -> list[float | list[float]]:
    """Every trajectory's advantage (a float, or one per response token: reinforce_plus_plus, remax);
    `penalties` (by batch index, one per response token) are subtracted from the token-level rewards
    first (KL in the reward, verl's `use_kl_in_reward`; outcome estimators use their sum)."""
    est = est or Estimator()
    trajs = batch.trajectories
    pen = penalties or {}
    rows = [token_rewards(t, pen.get(i)) for i, t in enumerate(trajs)]
    if est.name == "reinforce_plus_plus":
        return [a.tolist() for a in reinforce_plus_plus(rows, [_trained(t) for t in trajs], est.gamma)]
    if est.name == "gae":
        raise ValueError("adv_estimator gae: the advantages come from the critic (TrainBatch.advantages)")
    if est.name == "remax":
        return [a.tolist() for a in remax(rows, [reward_baseline(t) for t in trajs])]
    scores = [float(r.sum()) for r in rows]
    keys = [group_key(t) for t in trajs]
    if est.name == "group_norm":
        adv = group_advantages(scores, keys, norm_by_std=est.norm_by_std)
    elif est.name == "rloo":
        adv = rloo(scores, keys)
    elif est.name == "reinforce_plus_plus_baseline":
        adv = reinforce_plus_plus_baseline(scores, keys, [sum(_trained(t)) for t in trajs])
    elif est.name == "gpg":
        adv = gpg(scores, keys)
    else:
        raise ValueError(f"unknown adv_estimator '{est.name}'")
    return [float(a) for a in adv]


def batch_to_samples(batch: TrainBatch, drop_equal_groups: bool,
                     est: Estimator | None = None) -> tuple[list[Sample], int]:
    """Advantages per GRPO group (optionally dropping zero-signal groups); returns samples, dropped groups."""
    trajs = batch.trajectories
    keys = [group_key(t) for t in trajs]
    rewards = [t.reward for t in trajs]
    sizes: dict[Any, int] = {}
    for k in keys:
        sizes[k] = sizes.get(k, 0) + 1
    bad = {k: n for k, n in sizes.items() if n != batch.group_size}
    if bad:
        k, n = next(iter(bad.items()))
        raise ValueError(f"TrainBatch holds an incomplete group: prompt {k[0]} has {n} samples, "
                         f"group_size is {batch.group_size}")
    given = batch.advantages  # PPO: GAE from the critic, one row per trajectory
    adv = batch_advantages(batch, est) if given is None else [list(row) for row in given]
    drop = equal_reward_groups(rewards, keys) if drop_equal_groups else set()
    samples = []
    for i, (t, k) in enumerate(zip(trajs, keys, strict=True)):
        if k in drop or not t.response_token_ids:
            continue
        if len(t.logprobs) != len(t.response_token_ids):
            raise ValueError(f"trajectory {t.prompt_id}/{t.sample_idx}: {len(t.logprobs)} logprobs for "
                             f"{len(t.response_token_ids)} response tokens")
        samples.append(Sample(i, list(t.prompt_token_ids) + list(t.response_token_ids),
                              len(t.prompt_token_ids),
                              adv[i],
                              list(t.logprobs),
                              list(t.loss_mask) or None))
    return samples, len(drop)


def shard_for_dp(samples: list[Sample], dp: int, dp_rank: int) -> list[Sample]:
    """Greedy longest-first balancing of tokens across data-parallel ranks (deterministic)."""
    loads = [0] * dp
    mine: list[Sample] = []
    for s in sorted(samples, key=lambda s: (-s.length, s.index)):
        r = min(range(dp), key=lambda j: (loads[j], j))
        loads[r] += s.length
        if r == dp_rank:
            mine.append(s)
    return mine


def micro_batch_bounds(lengths: list[int], micro_batch_size: int, max_token_len: int = 0) -> list[int]:
    """End offsets of the micro-batches over samples sorted longest first: `micro_batch_size` each, or,
    with `max_token_len` (verl's use_dynamic_bsz), as many as fit that many padded tokens (at least
    one), so a long-tailed minibatch is not padded to its longest sample in every micro-batch."""
    ends, start = [], 0
    while start < len(lengths):
        end = start + 1
        while end < len(lengths) and (
            (end + 1 - start) * lengths[start] <= max_token_len if max_token_len
            else end - start < micro_batch_size
        ):
            end += 1
        ends.append(end)
        start = end
    return ends


def response_row(value: float | list[float] | list[int] | None, n: int, default: float = 0.0) -> torch.Tensor:
    """A per-response-token row of `n`: a scalar broadcast, a list taken as is (its length checked)."""
    if value is None:
        return torch.full((n,), default)
    if isinstance(value, (int, float)):
        return torch.full((n,), float(value))
    if len(value) != n:
        raise ValueError(f"{len(value)} per-token values for {n} response tokens")
    return torch.tensor(value, dtype=torch.float32)


def make_micro_batches(samples: list[Sample], micro_batch_size: int, max_token_len: int = 0,
                       pad_multiple: int = 1) -> list[dict[str, torch.Tensor]]:
    """Length-sorted micro-batches, right-padded to their own longest sample (causal mask: no leak),
    rounded up to `pad_multiple` (sequence parallelism splits the sequence over TP ranks)."""
    out = []
    ordered = sorted(samples, key=lambda s: (-s.length, s.index))
    start = 0
    for end in micro_batch_bounds([s.length for s in ordered], micro_batch_size, max_token_len):
        chunk, start = ordered[start:end], end
        seq = -(-max(s.length for s in chunk) // pad_multiple) * pad_multiple
        b = len(chunk)
        ids = torch.zeros(b, seq, dtype=torch.long)
        labels = torch.zeros(b, seq, dtype=torch.long)
        mask = torch.zeros(b, seq)
        adv = torch.zeros(b, seq)
        behav = torch.zeros(b, seq)
        for j, s in enumerate(chunk):
            t = torch.tensor(s.tokens, dtype=torch.long)
            ids[j, :s.length] = t[:-1]
            labels[j, :s.length] = t[1:]
            lo, hi = s.prompt_len - 1, s.length
            mask[j, lo:hi] = response_row(s.loss_mask, hi - lo, 1.0)
            adv[j, lo:hi] = response_row(s.advantage, hi - lo)
            behav[j, lo:hi] = torch.tensor(s.behaviour, dtype=torch.float32)
        out.append({"input_ids": ids, "labels": labels, "mask": mask, "adv": adv, "behav": behav,
                    "position_ids": torch.arange(seq).unsqueeze(0).expand(b, -1).contiguous(),
                    "index": torch.tensor([s.index for s in chunk]),
                    "lengths": torch.tensor([s.length for s in chunk]),
                    "resp_len": torch.tensor([s.response_len for s in chunk])})
    return out
