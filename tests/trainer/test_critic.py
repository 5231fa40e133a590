"""PPO's value model (`asp_npu.trainer.critic`) on megatron-core over gloo: TP=2 equals TP=1 after three
critic updates, and GAE advantages/returns of a hand-built trajectory through the critic path."""

from __future__ import annotations

import numpy as np
import pytest

from asp_npu.trainer.critic import explained_variance, gae_rows
from asp_npu.types import TrainBatch, Trajectory
from tests.trainer import critic_jobs
from tests.trainer.helpers import make_hf_model, run_ranks


def _traj(reward: float, n: int) -> Trajectory:
    return Trajectory(prompt_id="p", sample_idx=0, prompt_token_ids=[1, 2], response_token_ids=[3] * n,
                      logprobs=[-1.0] * n, finish_reason="stop", reward=reward, policy_version=0)


def test_gae_of_a_hand_built_trajectory_through_the_critic_path():
    # rewards [0, 0, 1] (outcome at the last token), values [0.5, 0.2, 0.4], gamma 0.9, lam 0.8:
    # delta2 = 1 - 0.4 = 0.6; delta1 = 0 + 0.9*0.4 - 0.2 = 0.16; delta0 = 0 + 0.9*0.2 - 0.5 = -0.32
    # A2 = 0.6; A1 = 0.16 + 0.72*0.6 = 0.592; A0 = -0.32 + 0.72*0.592 = 0.10624; R = A + V
    batch = TrainBatch([_traj(1.0, 3), _traj(0.0, 2)], group_size=1)
    adv, ret = gae_rows(batch, [[0.5, 0.2, 0.4], [0.3, -0.1]], gamma=0.9, lam=0.8)
    assert np.allclose(ret[0], [0.60624, 0.792, 1.0])
    # second: rewards [0, 0]; delta1 = 0.1, delta0 = 0.9*-0.1 - 0.3 = -0.39; A1 = 0.1, A0 = -0.39 + 0.072
    raw = np.array([0.10624, 0.592, 0.6, -0.318, 0.1])
    assert np.allclose(ret[1], [-0.018, 0.0])
    white = (raw - raw.mean()) / (raw.std(ddof=1) + 1e-8)  # whitened over the minibatch's tokens
    assert np.allclose(adv[0] + adv[1], white)
    assert explained_variance([[0.5, 0.2, 0.4]], [ret[0]]) == pytest.approx(
        1 - np.var(np.array(ret[0]) - [0.5, 0.2, 0.4], ddof=1) / np.var(ret[0], ddof=1))


@pytest.fixture(scope="module")
def parity(tmp_path_factory):
    model = str(make_hf_model(tmp_path_factory.mktemp("hf") / "m", tied=True, seed=3))
    one = run_ranks(1, critic_jobs.critic_parity, model, {}, timeout=600)[0]
    two = run_ranks(2, critic_jobs.critic_parity, model, {"tensor_model_parallel_size": 2}, timeout=600)
    sp = run_ranks(2, critic_jobs.critic_parity, model, {"tensor_model_parallel_size": 2,
                                                        "sequence_parallel": True}, timeout=600)
    return one, two, sp


@pytest.mark.slow
@pytest.mark.parametrize("which", [1, 2], ids=["TP2", "TP2 SP"])
def test_critic_tp2_equals_tp1_after_three_updates(parity, which):
    one, two = parity[0], parity[which]
    assert two[0]["probe"] == two[1]["probe"]  # every rank answers the same values
    diffs = [abs(a["critic/vf_loss"] - b["critic/vf_loss"])
             for a, b in zip(one["metrics"], two[0]["metrics"], strict=True)]
    probe = max(abs(x - y) for ra, rb in zip(one["probe"], two[0]["probe"], strict=True)
                for x, y in zip(ra, rb, strict=True))
    print(f"critic parity TP1 vs {'TP2 SP' if which == 2 else 'TP2'} after 3 steps: max |vf_loss diff| "
          f"{max(diffs):.2e}, max |value diff| {probe:.2e}")
    assert max(diffs) < 1e-5 and probe < 1e-5
    assert one["versions"] == [0, 1, 2]
    # the critic learned: its head left zero and the value loss moved
    assert one["head_abs"] > 0
    losses = [m["critic/vf_loss"] for m in one["metrics"]]
    assert losses[0] != losses[-1] and all(np.isfinite(losses))
    assert max(abs(v) for row in one["probe"] for v in row) > 0


@pytest.mark.slow
def test_critic_checkpoint_round_trip(tmp_path):
    model = str(make_hf_model(tmp_path / "m", tied=False, seed=4))
    r = run_ranks(1, critic_jobs.critic_checkpoint, model, str(tmp_path / "ckpt"), timeout=600)[0]
    assert r["probe_b"] == r["probe_a"] and r["probe_b"][1] != r["fresh"][1]  # weights and version back
    assert r["next_b"]["critic/vf_loss"] == r["next_a"]["critic/vf_loss"]  # and the optimizer state
    assert r["next_b"]["critic/version"] == r["next_a"]["critic/version"] == 3.0
