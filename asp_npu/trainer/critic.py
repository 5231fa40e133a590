"""PPO's value model (`rl_config.adv_estimator: gae`): the policy's architecture with a scalar head.

The critic is a megatron-core GPTModel built and loaded from the policy's HF weights exactly as the
trainer's (`TrainerWorker`), whose vocabulary output layer is replaced by a vocab-free `ValueHead`
(hidden -> 1, zero-initialised: the first values are 0, so the first advantages are the discounted
returns). It has its own TP/PP/DP layout and optimizer (`critic_config`, MindSpeed-RL's keys): a
`CriticWorker` is a `TrainerWorker` over `critic_view(cfg)`, the config with `actor_config` replaced by
the critic's, so process groups, DDP, megatron's optimizer, lr schedule, micro-batching and the pipeline
schedule are the trainer's own code. Its "log-probs" are values: one per token, the value of the state
before each response token (verl's `values[:, -response_length - 1:-1]`).

Value loss (verl `compute_value_loss`): 0.5 x agg(max((v - R)^2, (clip(v, v_old +- c) - R)^2)) over the
response tokens with the trainer's `loss_agg_mode`, `c = rl_config.cliprange_value` (0: unclipped),
`v_old` the values the critic scored the sample with, `R` GAE's returns.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from asp_npu.config import Config, critic_view
from asp_npu.trainer.batching import Sample, agg_norm
from asp_npu.trainer.losses import AggNorm, row_weights
from asp_npu.trainer.start import RankStart
from asp_npu.trainer.worker import TrainerWorker
from asp_npu.types import TrainBatch

VALUE_STAT_KEYS = ("vf_loss", "vf_clipped", "vpred_sum", "tokens")


class ValueHead(torch.nn.Module):
    """hidden [s, b, h] -> values [s, b, 1], replicated on every TP rank (called as megatron calls its
    output layer: `weight=` and `runtime_gather_output=` are ignored). Under sequence parallelism the
    hidden states are gathered over TP first; every rank then computes the same values, so the backward
    only takes its own sequence chunk (no reduce-scatter of identical gradients)."""

    def __init__(self, hidden_size: int, dtype: torch.dtype, sequence_parallel: bool = False) -> None:
        super().__init__()
        self.sequence_parallel = sequence_parallel
        # `weight` / `bias` as megatron's output layer names them (its sharded checkpoint expects them)
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=dtype))

    def forward(self, hidden: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None
                ) -> tuple[torch.Tensor, None]:
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return torch.nn.functional.linear(hidden, self.weight, self.bias), None


def value_head_model(model: Any) -> Any:
    """The GPTModel stage with its output layer replaced by a `ValueHead` (last stage) and no tied
    embedding (every stage, so no stage waits on the embedding group's gradient all-reduce)."""
    model.share_embeddings_and_output_weights = False
    if getattr(model, "post_process", False):
        model.output_layer = ValueHead(model.config.hidden_size, model.config.params_dtype,
                                       bool(model.config.sequence_parallel))
    return model


def value_loss(vpred: torch.Tensor, old: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               resp_len: torch.Tensor, cliprange: float, mode: str, norm: AggNorm
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """verl's clipped value loss of one micro-batch [b, s] as its share of the whole minibatch's
    aggregate (`row_weights`); statistics are sums (tokens clipped, predicted values, tokens)."""
    vpred = vpred.float()
    l1 = (vpred - returns) ** 2
    if cliprange > 0:
        clipped = old + torch.clamp(vpred - old, -cliprange, cliprange)
        l2 = (clipped - returns) ** 2
        per_token, was_clipped = torch.maximum(l1, l2), (l2 > l1).float()
    else:
        per_token, was_clipped = l1, torch.zeros_like(l1)
    weight = mask * row_weights(resp_len, mode, norm).to(vpred.dtype).unsqueeze(-1)
    loss = 0.5 * (per_token * weight).sum()
    stats = {"vf_loss": loss.detach(), "vf_clipped": (was_clipped * mask).sum(),
             "vpred_sum": (vpred.detach() * mask).sum(), "tokens": mask.sum()}
    return loss, stats


class CriticWorker(TrainerWorker):
    """One rank of the value model: `TrainerWorker` over `critic_view(cfg)` with a `ValueHead`."""

    def __init__(self, cfg: Config, rank: int, world_size: int, master_addr: str = "127.0.0.1",
                 master_port: int = 29500, local_rank: int = 0, start: RankStart | None = None) -> None:
        super().__init__(critic_view(cfg), rank, world_size, master_addr, master_port, local_rank, start)

    def _adapt(self, model: Any) -> Any:
        return value_head_model(model)

    def _token_logprobs(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The values [b, s] (the head's one output per token) in place of log-probs."""
        return logits[..., 0].float()

    def values(self, batch: TrainBatch) -> tuple[list[list[float]], int]:
        """Every trajectory's value per response token (same order as the batch) and the critic
        version that scored them."""
        with self._resident(weights_only=True):
            return self._compute_logprobs(batch), self.version

    def critic_step(self, batch: TrainBatch, old_values: list[list[float]], returns: list[list[float]]
                    ) -> dict[str, float]:
        """One critic update (x critic_config.ppo_epochs) towards `returns` (per response token)."""
        with self._resident():
            return self._critic_step(batch, old_values, returns)

    def _critic_step(self, batch: TrainBatch, old_values: list[list[float]], returns: list[list[float]]
                     ) -> dict[str, float]:
        t0 = time.perf_counter()
        samples = [Sample(i, list(t.prompt_token_ids) + list(t.response_token_ids), len(t.prompt_token_ids),
                          list(returns[i]), list(old_values[i]), list(t.loss_mask) or None)
                   for i, t in enumerate(batch.trajectories) if t.response_token_ids]
        norm = agg_norm(samples, self.cfg)
        micro = self._my_micro_batches(samples)
        rl = self.cfg.rl_config
        epochs = max(1, self.cfg.actor_config.ppo_epochs)
        self.model.train()
        sums = dict.fromkeys(VALUE_STAT_KEYS, 0.0)
        norms = []
        for _ in range(epochs):
            self._zero_grad()

            def loss_fn(k: int, mb: dict[str, torch.Tensor], vpred: torch.Tensor
                        ) -> tuple[torch.Tensor, dict]:
                return value_loss(vpred, mb["behav"], mb["adv"], mb["mask"], mb["resp_len"],
                                  rl.cliprange_value, rl.loss_agg_mode, norm)

            for st in self._run_schedule(self.model, micro, loss_fn, forward_only=False):
                for key in VALUE_STAT_KEYS:
                    sums[key] += float(st[key])
            norms.append(self._optimizer_step())
        sums, _ = self._reduce_stats(sums, {})
        self.step += 1
        self.version += 1
        tokens = max(sums["tokens"], 1.0)
        return {"critic/vf_loss": sums["vf_loss"] / epochs,
                "critic/vf_clipfrac": sums["vf_clipped"] / tokens,
                "critic/vpred_mean": sums["vpred_sum"] / tokens, "critic/grad_norm": float(np.mean(norms)),
                "critic/lr": self.last_lr, "critic/version": float(self.version),
                "critic/step_time_s": time.perf_counter() - t0}

    def get_hf_weights(self) -> Any:
        raise NotImplementedError("the critic has no HF policy weights to publish")


def gae_rows(batch: TrainBatch, values: list[list[float]], gamma: float, lam: float
             ) -> tuple[list[list[float]], list[list[float]]]:
    """PPO's per-token advantages (GAE, then whitened over the minibatch's response tokens, verl's
    `compute_gae_advantage_return`) and returns (GAE + values, not whitened) of every trajectory, with
    the outcome reward at its last response token."""
    from asp_npu.trainer.advantages import gae, whiten

    advs, rets = [], []
    for t, v in zip(batch.trajectories, values, strict=True):
        n = len(t.response_token_ids)
        if len(v) != n:
            raise ValueError(f"trajectory {t.prompt_id}/{t.sample_idx}: {len(v)} values for {n} "
                             "response tokens")
        rewards = [0.0] * n
        if n:
            rewards[-1] = float(t.reward)
        a, r = gae(rewards, v, gamma, lam)
        advs.append(a)
        rets.append(r.tolist())
    return [a.tolist() for a in whiten(advs)], rets


def explained_variance(values: list[list[float]], returns: list[list[float]]) -> float:
    """verl's `critic/vf_explained_var`: 1 - Var(R - V) / Var(R) over every response token (unbiased)."""
    v = np.concatenate([np.asarray(x, dtype=np.float64) for x in values]) if values else np.zeros(0)
    r = np.concatenate([np.asarray(x, dtype=np.float64) for x in returns]) if returns else np.zeros(0)
    if r.size < 2:
        return 0.0
    var_r = r.var(ddof=1)
    return float(1.0 - (r - v).var(ddof=1) / (var_r + 1e-8))
