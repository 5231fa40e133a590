"""megatron-core on CPU (gloo): HF parity, TP/PP/DP loss equivalence, and the direction of a GRPO step."""

from __future__ import annotations

import pytest

from tests.trainer import jobs
from tests.trainer.helpers import make_hf_model, run_ranks

pytestmark = pytest.mark.slow

LAYOUTS_2 = [(2, 1, 1), (1, 2, 1), (1, 1, 2)]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    tied = make_hf_model(root / "tied", tied=True)
    return str(tied), str(make_hf_model(root / "untied", tied=False, seed=1))


@pytest.fixture(scope="module")
def single(model_dirs):
    return run_ranks(1, jobs.parity_and_losses, *model_dirs, [(1, 1, 1)])[0]


@pytest.fixture(scope="module")
def double(model_dirs):
    results = run_ranks(2, jobs.parity_and_losses, *model_dirs, LAYOUTS_2)
    assert results[0] == results[1]  # every rank reports the same reduced metrics and gathered logits
    return results[0]


@pytest.mark.parametrize("name", ["tied", "untied"])
def test_hf_parity_tp1_and_tp2(single, double, name):
    assert single[f"{name}/tp1pp1dp1/logit_err"] < 1e-5
    assert double[f"{name}/tp2pp1dp1/logit_err"] < 1e-5


@pytest.mark.parametrize("name", ["tied", "untied"])
@pytest.mark.parametrize("layout", LAYOUTS_2, ids=["tp2", "pp2", "dp2"])
def test_parallel_layouts_give_the_tp1_loss(single, double, name, layout):
    """Same batch, same initial weights: identical loss at step 1 and, after an update, at step 2."""
    tp, pp, dp = layout
    ref = single[f"{name}/tp1pp1dp1/losses"]
    got = double[f"{name}/tp{tp}pp{pp}dp{dp}/losses"]
    assert ref[0] != ref[1]  # the update changed the policy, so step 2 checks gradients and sync too
    assert got == pytest.approx(ref, abs=1e-5)


def test_grpo_step_moves_logprobs_with_the_advantages(model_dirs):
    out = run_ranks(1, jobs.grpo_direction, model_dirs[1])[0]
    for before, after, reward in zip(out["before"], out["after"], out["rewards"], strict=True):
        delta = sum(after) - sum(before)
        if reward > 0.5:
            assert delta > 0, (before, after)
        else:
            assert delta < 0, (before, after)
    m = out["metrics"]
    assert m["policy_version"] == 1.0 and m["iw/mean"] == pytest.approx(1.0, abs=1e-5)
    assert m["grad_norm"] > 0 and m["tokens_per_s"] > 0


def test_grpo_options_kl_epochs_dapo_importance_truncation_and_bf16(model_dirs, single):
    out = run_ranks(1, jobs.grpo_options, model_dirs[0])[0]
    m = out["first"]
    # DAPO dynamic sampling filters equal-reward groups in the pipeline (queue actor), before the
    # trainer: a group that reaches it (past filter_groups_max_batches) is trained with zero advantage
    assert m["dropped_groups"] == 0 and m["samples"] == 12
    assert m["kl"] > 0  # the second epoch moved away from the reference
    assert m["clip_frac"] > 0  # ... and beyond the proximal trust region for some tokens
    assert m["iw/truncated_frac"] == 1.0 and m["iw/min"] > 2.0
    s = out["skipped"]
    assert s.get("skipped", 0.0) == 0.0 and s["dropped_groups"] == 0 and s["policy_version"] == 2.0
    assert out["version"] == 2
    # bf16 weights with fp32 master copies track the fp32 run closely
    assert out["bf16_master"] == "torch.float32"
    assert out["bf16_losses"] == pytest.approx(single["tied/tp1pp1dp1/losses"], abs=5e-3)
