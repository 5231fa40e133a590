"""The loss's new terms on megatron-core over gloo: vocabulary-parallel entropy at TP=2 equals TP=1,
every aggregation is independent of the TP / DP / micro-batch layout, the adaptive KL controller
follows its formula on the recorded run, KL in the reward, and padded junk changes no weight."""

from __future__ import annotations

import numpy as np
import pytest

from tests.trainer import loss_jobs
from tests.trainer.helpers import make_hf_model, run_ranks

pytestmark = pytest.mark.slow

ONE = {"TP1": {}, "TP1 mbs1": {"micro_batch_size": 1}, "TP1 reward": {"use_kl_in_reward": True}}
TWO = {"TP2": {"tensor_model_parallel_size": 2}, "DP2": {"data_parallel_size": 2},
       "TP2 reward": {"tensor_model_parallel_size": 2, "use_kl_in_reward": True}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    model = str(make_hf_model(tmp_path_factory.mktemp("hf") / "m", tied=False, seed=1))
    one = run_ranks(1, loss_jobs.loss_parity, model, ONE, timeout=600)[0]
    two = run_ranks(2, loss_jobs.loss_parity, model, TWO, timeout=600)
    timing = ("step_time_s", "tokens_per_s")
    for name in TWO:  # every rank reports the same reduced metrics
        for m0, m1 in zip(two[0][name]["metrics"], two[1][name]["metrics"], strict=True):
            assert {k: v for k, v in m0.items() if k not in timing} == \
                {k: v for k, v in m1.items() if k not in timing}
    return {**one, **two[0]}


def _series(run: dict, key: str) -> list[float]:
    return [m[key] for m in run["metrics"]]


def test_entropy_at_tp2_equals_tp1(runs):
    ref, got = runs["TP1"]["entropy"], runs["TP2"]["entropy"]
    assert ref.keys() == got.keys()
    diff = max(abs(a - b) for i in ref for a, b in zip(ref[i], got[i], strict=True))
    assert diff < 1e-5
    assert _series(runs["TP2"], "entropy") == pytest.approx(_series(runs["TP1"], "entropy"), abs=1e-5)
    assert min(_series(runs["TP1"], "entropy")) > 0


@pytest.mark.parametrize("name", ["TP2", "DP2", "TP1 mbs1"])
def test_the_loss_does_not_depend_on_the_layout(runs, name):
    """seq-mean-token-mean + entropy + adaptive KL: same losses over 3 steps, so same gradients."""
    for key in ("loss", "pg_loss", "kl", "kl_coef", "grad_norm"):
        assert _series(runs[name], key) == pytest.approx(_series(runs["TP1"], key), rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("name", ["TP1", "TP1 reward"])
def test_adaptive_kl_follows_its_controller_on_the_recorded_run(runs, name):
    rl = loss_jobs.LOSS_RL
    m = runs[name]["metrics"]
    assert m[0]["kl_coef"] == rl["kl_coef"]
    for prev, nxt in zip(m, m[1:], strict=False):
        err = float(np.clip(prev["kl_seq_mean"] / rl["kl_target"] - 1, -0.2, 0.2))
        want = prev["kl_coef"] * (1 + err * prev["samples"] / rl["kl_horizon"])
        assert nxt["kl_coef"] == pytest.approx(want, rel=1e-12)
    assert len({x["kl_coef"] for x in m}) == len(m)  # it moved every step


def test_kl_in_the_reward_replaces_the_loss_term_and_matches_over_tp(runs):
    r1, r2 = runs["TP1 reward"]["metrics"], runs["TP2 reward"]["metrics"]
    assert all(x["kl_reward_penalty"] > 0 for x in r1[1:])  # the first step starts at the reference
    assert _series(runs["TP2 reward"], "kl_reward_penalty") == pytest.approx(
        _series(runs["TP1 reward"], "kl_reward_penalty"), rel=1e-4, abs=1e-9)
    assert [x["loss"] for x in r2] == pytest.approx([x["loss"] for x in r1], rel=1e-4, abs=1e-6)
    assert [x["loss"] for x in r1] != pytest.approx(_series(runs["TP1"], "loss"), rel=1e-6)


def test_padded_junk_trains_to_the_same_weights(tmp_path):
    model = str(make_hf_model(tmp_path / "m", tied=True))
    out = run_ranks(1, loss_jobs.padded_junk, model, timeout=600)[0]
    assert out["junk"]["junked_positions"] > 0 and out["junk"]["finite"]
    for k, v in out["clean"]["weights"].items():
        assert np.array_equal(v, out["junk"]["weights"][k]), k
    assert out["junk"]["metrics"]["loss"] == out["clean"]["metrics"]["loss"]


def test_the_adaptive_kl_coefficient_resumes_from_the_checkpoint(tmp_path):
    model = str(make_hf_model(tmp_path / "m", tied=True))
    out = run_ranks(1, loss_jobs.kl_resume, model, str(tmp_path / "ckpt"), timeout=600)[0]
    assert out["fresh"] == loss_jobs.LOSS_RL["kl_coef"] != out["saved"]
    assert out["loaded"] == out["saved"]
    for key in ("kl_coef", "loss", "kl"):
        assert out["resumed"][key] == pytest.approx(out["uninterrupted"][key], rel=1e-6, abs=1e-9), key
