"""Qwen3, Qwen3-MoE and Llama 3 on megatron-core (CPU/gloo): HF logits parity at TP=1 and TP=2 with an
exact HF round trip, a GRPO step moving logprobs with the advantages, and EP=1 vs EP=2 parity."""

from __future__ import annotations

import numpy as np
import pytest

from tests.trainer import family_jobs
from tests.trainer.helpers import make_hf_model, run_ranks

pytestmark = pytest.mark.slow

ARCHS = ["qwen3", "qwen3-moe", "llama"]


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    # Qwen3 ties embeddings (as its small checkpoints do); the MoE and Llama models do not
    return {a: str(make_hf_model(root / a, tied=a == "qwen3", arch=a, seed=i)) for i, a in enumerate(ARCHS)}


@pytest.fixture(scope="module")
def parity(family_dirs):
    dirs = [family_dirs[a] for a in ARCHS]
    tp1 = run_ranks(1, family_jobs.parity, dirs, 1)[0]
    tp2 = run_ranks(2, family_jobs.parity, dirs, 2)
    assert tp2[0] == tp2[1]
    return {a: (tp1[family_dirs[a]], tp2[0][family_dirs[a]]) for a in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_logits_parity_tp1_tp2_and_exact_round_trip(parity, arch):
    for result in parity[arch]:
        assert result["logit_err"] < 1e-5
        assert result["roundtrip_exact"]


@pytest.mark.parametrize("arch", ARCHS)
def test_grpo_step_moves_logprobs_with_the_advantages(family_dirs, arch):
    out = run_ranks(1, family_jobs.grpo_directions, [family_dirs[arch]])[0][family_dirs[arch]]
    for before, after, reward in zip(out["before"], out["after"], out["rewards"], strict=True):
        delta = sum(after) - sum(before)
        assert delta > 0 if reward > 0.5 else delta < 0, (arch, before, after)
    if arch == "qwen3-moe":
        assert out["metrics"]["moe_aux_loss"] > 0


def test_expert_parallel_ep2_matches_ep1_after_three_steps(family_dirs):
    """fp32, DP=2: EP=1 (every rank all 4 experts) vs EP=2 (2 experts per rank), same batches."""
    d = family_dirs["qwen3-moe"]
    ep1 = run_ranks(2, family_jobs.ep_run, d, 1)[0]
    ep2 = run_ranks(2, family_jobs.ep_run, d, 2)[0]
    assert len(set(ep1["losses"])) == 3  # the updates changed the policy
    assert ep2["losses"] == pytest.approx(ep1["losses"], abs=1e-5)
    assert ep2["grad_norms"] == pytest.approx(ep1["grad_norms"], abs=1e-5)
    assert ep2["aux"] == pytest.approx(ep1["aux"], abs=1e-5)
    assert sorted(ep2["grads"]) == sorted(ep1["grads"])
    assert any("experts.3." in k for k in ep2["grads"])  # gathered from the other expert-parallel rank
    assert max(float(np.abs(ep1["grads"][k] - ep2["grads"][k]).max()) for k in ep1["grads"]) < 1e-5
    assert max(float(np.abs(ep1["weights"][k] - ep2["weights"][k]).max()) for k in ep1["weights"]) < 1e-5
