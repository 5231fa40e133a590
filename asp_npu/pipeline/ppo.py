"""PPO with a critic in the pipeline (`rl_config.adv_estimator: gae`): one trainer step of the policy and
its value model.

Per minibatch the critic (`trainer.critic`, its own TrainerGroup in the layout of `critic_config`;
on CPU its ranks share the trainer ranks' cores and placement bundles: colocated) scores every sample
(one value per response token) and the version of the critic that scored it is recorded; GAE turns the
outcome reward at the last token and those values into per-token advantages (whitened over the
minibatch) and returns; the policy updates on the advantages (not during the first
`trainer.critic_warmup` steps, verl's critic warm-up), then the critic on the returns, clipped around
the values it scored with (`rl_config.cliprange_value`).

Critic staleness: the values a step trains on come from critic version `c`; the critic that updates
on them is at version `c'`; `critic/lag = c' - c` is bounded by `rl_config.max_lag`, the policy's
rule. Scoring right before the update, as here, makes it 0 (the bound is checked, not assumed).
Metrics in verl's names: `critic/vf_loss`, `critic/vf_explained_var`, `critic/vpred_mean`,
`critic/vf_clipfrac`, `critic/lag`, plus `critic/values_mean`, `critic/returns_mean`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from asp_npu.config import Config
from asp_npu.types import TrainBatch


class CriticLagError(RuntimeError):
    """The critic would update on values older than `rl_config.max_lag` critic versions."""


class PPOStep:
    """`step(batch)`: score, GAE, policy update (after warm-up), critic update; returns the metrics."""

    def __init__(self, cfg: Config, trainer: Any, critic: Any) -> None:
        self.cfg, self.trainer, self.critic = cfg, trainer, critic
        self.critic_version = 0
        self.steps = 0

    def step(self, batch: TrainBatch) -> dict[str, float]:
        from asp_npu.trainer.critic import explained_variance, gae_rows

        rl = self.cfg.rl_config
        values, scored_by = self.critic.call("values", batch)
        advantages, returns = gae_rows(batch, values, rl.gamma, rl.lam)
        if self.steps < self.cfg.trainer.critic_warmup:  # the critic learns first (verl critic_warmup)
            out = {**self.trainer.call("hold_step"), "critic/warmup": 1.0}
            self.trainer.version = int(out["policy_version"])
        else:
            out = {**self.trainer.train_step(replace(batch, advantages=advantages)), "critic/warmup": 0.0}
        lag = self.critic_version - scored_by
        if lag > rl.max_lag:
            raise CriticLagError(f"critic lag {lag} beyond rl_config.max_lag={rl.max_lag}")
        import ray

        critic_out = self.critic.call("critic_step", ray.put(batch), values, returns)
        self.critic_version = int(critic_out["critic/version"])
        self.steps += 1
        flat_v = [x for row in values for x in row]
        flat_r = [x for row in returns for x in row]
        out.update(critic_out)
        out.update({"critic/lag": float(lag), "critic/scored_by": float(scored_by),
                    "critic/vf_explained_var": explained_variance(values, returns),
                    "critic/values_mean": float(np.mean(flat_v)) if flat_v else 0.0,
                    "critic/returns_mean": float(np.mean(flat_r)) if flat_r else 0.0})
        return out
