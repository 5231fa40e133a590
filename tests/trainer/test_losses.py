"""GRPO / DAPO / decoupled-PPO loss pieces against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from asp_npu.trainer.losses import LossConfig, equal_reward_groups, group_advantages, kl_penalty, policy_loss


def test_policy_loss_matches_hand_computed_toy_example():
    # one sample, 3 response tokens + 1 masked (prompt) position
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], requires_grad=True)
    prox = torch.tensor([[-1.2, -1.5, -0.5, -9.0]])
    behav = torch.tensor([[-1.0, -1.5, -1.0, -9.0]])
    adv = torch.tensor([[2.0, -1.0, 0.5, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    cfg = LossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, importance_cap=1.5)
    loss, st = policy_loss(logp, prox, behav, adv, mask, cfg, norm=3.0)
    # token 1: r = e^0.2 = 1.221 (inside [0.8, 1.28]); w = e^-0.2; w * -A r = e^-0.2 * -2 e^0.2 = -2
    # token 2: r = e^-0.5 = 0.607, A < 0: max(0.607, 1 * 0.8) = 0.8 (clipped); w = e^0 = 1 -> 0.8
    # token 3: r = 1 -> -0.5; raw w = e^0.5 = 1.649 truncated to 1.5 -> -0.75
    assert loss.item() == pytest.approx((-2.0 + 0.8 - 0.75) / 3, abs=1e-6)
    assert st["clipped"].item() == 1 and st["iw_truncated"].item() == 1 and st["tokens"].item() == 3
    assert st["iw_sum"].item() == pytest.approx(math.exp(-0.2) + 1 + math.exp(0.5), abs=1e-6)
    assert st["iw_max"].item() == pytest.approx(math.exp(0.5))
    assert st["iw_min"].item() == pytest.approx(math.exp(-0.2))
    loss.backward()
    g = logp.grad[0]
    # d/dlogp: token 1 = w * -A * r / 3 = -2/3; token 2 clipped -> 0; token 3 = 1.5 * -0.5 / 3; masked -> 0
    assert g.tolist() == pytest.approx([-2 / 3, 0.0, -0.25, 0.0], abs=1e-6)


def test_kl_term_and_no_correction():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.1, -1.0]])
    k3 = [math.exp(-0.1) + 0.1 - 1, math.exp(1.0) - 1.0 - 1]
    assert kl_penalty(logp, ref, "low_var_kl")[0].tolist() == pytest.approx(k3, abs=1e-6)
    assert kl_penalty(logp, ref, "kl")[0].tolist() == pytest.approx([-1.0 + 1.1, -2.0 + 1.0], abs=1e-6)
    cfg = LossConfig(kl_coef=0.5, importance_cap=0.0)  # cap <= 0: no off-policy weight
    adv = torch.tensor([[1.0, 1.0]])
    loss, st = policy_loss(logp, logp, logp - 3.0, adv, torch.ones(1, 2), cfg, 2.0, ref)
    assert loss.item() == pytest.approx((-1 - 1 + 0.5 * sum(k3)) / 2, abs=1e-6)
    assert st["kl"].item() == pytest.approx(sum(k3), abs=1e-6)
    with pytest.raises(ValueError, match="unknown kl_penalty"):
        kl_penalty(logp, ref, "k9")


def test_group_advantages_and_equal_reward_groups():
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5]
    groups = ["a", "a", "a", "a", "b", "b"]
    adv = group_advantages(rewards, groups)
    s = math.sqrt(4 * 0.25 / 3)  # unbiased std of [1, 0, 0, 1]
    assert adv.tolist() == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0, 0.0], abs=1e-5)
    assert equal_reward_groups(rewards, groups) == {"b"}
    assert group_advantages([3.0], ["x"]).tolist() == pytest.approx([3.0], abs=1e-5)  # verl: mean 0, std 1
