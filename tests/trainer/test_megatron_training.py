"""megatron-core's training machinery on CPU (gloo): DDP + distributed optimizer, sequence parallel,
recomputation, offload and resharding checkpoints give the single-rank trainer's numbers."""

from __future__ import annotations

import numpy as np
import pytest

from tests.trainer import jobs
from tests.trainer.helpers import make_hf_model, run_ranks

pytestmark = pytest.mark.slow

ONE_RANK = {
    "base": {},
    "dp1_distopt": {"use_distributed_optimizer": True},
    "recompute_full": {"recompute_granularity": "full", "recompute_method": "uniform",
                       "recompute_num_layers": 1},
    "recompute_block": {"recompute_granularity": "full", "recompute_method": "block",
                        "recompute_num_layers": 2},
    "recompute_selective": {"recompute_granularity": "selective"},
}
TWO_RANKS = {
    "dp2_distopt": {"data_parallel_size": 2, "use_distributed_optimizer": True},
    "tp2_sp": {"tensor_model_parallel_size": 2, "sequence_parallel": True},
    "cp2": {"context_parallel_size": 2},
    "cp2_distopt": {"context_parallel_size": 2, "use_distributed_optimizer": True},
}
FOUR_RANKS = {
    "tp2_sp_cp2": {"tensor_model_parallel_size": 2, "sequence_parallel": True, "context_parallel_size": 2},
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_hf_model(tmp_path_factory.mktemp("hf") / "tied", tied=True))


@pytest.fixture(scope="module")
def one(model_dir):
    return run_ranks(1, jobs.training_parity, model_dir, ONE_RANK)[0]


@pytest.fixture(scope="module")
def two(model_dir):
    return run_ranks(2, jobs.training_parity, model_dir, TWO_RANKS)


def max_grad_diff(a: list[dict], b: list[dict]) -> float:
    assert len(a) == len(b) == 3 and all(set(x) == set(y) for x, y in zip(a, b, strict=True))
    return max(float(np.abs(x[k] - y[k]).max()) for x, y in zip(a, b, strict=True) for k in x)


@pytest.fixture(scope="module")
def four(model_dir):
    return run_ranks(4, jobs.training_parity, model_dir, FOUR_RANKS, timeout=480.0)


def assert_same_training(ranks: list[dict], name: str, want: dict) -> None:
    got = ranks[0][name]
    assert len(set(want["losses"])) == 3  # every update changed the policy
    assert got["losses"] == pytest.approx(want["losses"], abs=1e-5)
    assert got["grad_norms"] == pytest.approx(want["grad_norms"], abs=1e-5)
    assert max_grad_diff(got["grads"], want["grads"]) < 1e-5
    for r in ranks:  # every rank reports the same reduced metrics and whole-sequence logprobs
        assert r[name]["losses"] == got["losses"]
        assert [len(x) for x in r[name]["logprobs"]] == [len(x) for x in want["logprobs"]]
        assert max(abs(a - b) for x, y in zip(r[name]["logprobs"], want["logprobs"], strict=True)
                   for a, b in zip(x, y, strict=True)) < 1e-5


@pytest.mark.parametrize(("name", "ref"), [("dp2_distopt", "dp1_distopt"), ("tp2_sp", "base"),
                                           ("cp2", "base"), ("cp2_distopt", "dp1_distopt")])
def test_parallel_training_matches_one_rank_for_three_steps(one, two, name, ref):
    assert_same_training(two, name, one[ref])


def test_tensor_sequence_and_context_parallel_together_match_one_rank(one, four):
    assert_same_training(four, "tp2_sp_cp2", one["base"])


def test_context_parallel_attention_really_sees_the_other_chunks(two):
    """Each CP rank holds half of every sequence; with the other rank's keys left out the logprobs
    of the second half would differ from TP=1's, which the parity above already rules out. Here: the
    distributed optimizer shards its state over the data x context parallel ranks."""
    halves = [r["cp2_distopt"]["bytes"]["optimizer"] for r in two]
    full = two[0]["cp2"]["bytes"]["optimizer"]
    assert all(h / full == pytest.approx(0.5, abs=0.01) for h in halves)


@pytest.mark.parametrize("name", ["recompute_full", "recompute_block", "recompute_selective"])
def test_recompute_gives_the_same_losses_and_gradients(one, name):
    assert one[name]["core_attn_calls"] == 2 * one["base"]["core_attn_calls"] > 0  # really recomputed
    assert one[name]["losses"] == pytest.approx(one["base"]["losses"], abs=1e-5)
    assert max_grad_diff(one[name]["grads"], one["base"]["grads"]) < 1e-5


def test_distributed_optimizer_halves_optimizer_state_per_rank(one, two):
    full = one["dp1_distopt"]["bytes"]
    halves = [r["dp2_distopt"]["bytes"] for r in two]
    assert full["optimizer"] > 0 and full["optimizer"] == one["base"]["bytes"]["optimizer"]
    for h in halves:
        assert h["optimizer"] / full["optimizer"] == pytest.approx(0.5, abs=0.01)
        assert h["weights"] == full["weights"] and h["grads"] == full["grads"]  # replicated over DP
    assert sum(h["optimizer"] for h in halves) == pytest.approx(full["optimizer"], rel=1e-3)
    tp2 = [r["tp2_sp"]["bytes"] for r in two]
    for t in tp2:  # TP shards weights, gradients and state (norms are replicated: a little over half)
        for k in ("weights", "grads", "optimizer"):
            assert 0.5 < t[k] / one["base"]["bytes"][k] < 0.6


@pytest.mark.parametrize("dist_opt", [True, False], ids=["distopt", "plain"])
def test_checkpoint_saved_at_tp2_resumes_at_dp2(model_dir, tmp_path, dist_opt):
    out = run_ranks(2, jobs.reshard_resume, model_dir, str(tmp_path / "ckpt"), (2, 1), (1, 2), dist_opt)[0]
    assert out["meta"]["layout"] == {"tp": 2, "pp": 1, "dp": 1, "cp": 1} and out["meta"]["step"] == 2
    for key in ("loss", "grad_norm"):  # the next loss, and the one after the resumed Adam update
        got, want = [m[key] for m in out["resumed"]], [m[key] for m in out["uninterrupted"]]
        assert got == pytest.approx(want, abs=1e-5)
    assert out["version"] == 4


def test_checkpoint_saved_at_cp2_resumes_at_tp2(model_dir, tmp_path):
    out = run_ranks(2, jobs.reshard_resume, model_dir, str(tmp_path / "ckpt"), (1, 1, 2), (2, 1, 1), True)[0]
    assert out["meta"]["layout"] == {"tp": 1, "pp": 1, "dp": 1, "cp": 2}
    for key in ("loss", "grad_norm"):
        got, want = [m[key] for m in out["resumed"]], [m[key] for m in out["uninterrupted"]]
        assert got == pytest.approx(want, abs=1e-5)


def test_offload_frees_trainer_memory_between_updates_and_trains_the_same(model_dir):
    out = run_ranks(1, jobs.offload_cycle, model_dir)[0]
    plain, off = out["plain"], out["offload"]
    assert off["losses"] == plain["losses"]  # moved out and back bit for bit
    assert off["logprobs"] == plain["logprobs"]
    assert all(np.array_equal(off["weights"][k], plain["weights"][k]) for k in plain["weights"])
    nothing = {"weights": 0, "grads": 0, "optimizer": 0}
    assert off["initial"] == nothing and all(b == nothing for b in off["between"])
    assert off["after_reads"] == nothing  # reading weights brings them back only for the call
    assert off["resident"] == plain["between"][-1]  # back before the update: everything, same sizes
    assert all(v > 0 for v in plain["between"][-1].values())
