"""LoRA on megatron-core's tensor-parallel layers: only the adapters train (the base bytes stay), and
TP=2 (with and without sequence parallelism) gives TP=1's adapter gradients and merged weights."""

from __future__ import annotations

import numpy as np
import pytest

from tests.trainer import lora_jobs
from tests.trainer.helpers import make_hf_model, run_ranks

pytestmark = pytest.mark.slow

TWO = {"tp2": {"tensor_model_parallel_size": 2},
       "tp2_sp": {"tensor_model_parallel_size": 2, "sequence_parallel": True}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_hf_model(tmp_path_factory.mktemp("hf") / "tied", tied=True))


@pytest.fixture(scope="module")
def one(model_dir):
    return run_ranks(1, lora_jobs.lora_training, model_dir, {"base": {}})[0]["base"]


@pytest.fixture(scope="module")
def two(model_dir):
    return run_ranks(2, lora_jobs.lora_training, model_dir, TWO, timeout=480.0)


def test_only_adapters_train_and_the_base_bytes_stay(one, two):
    assert one["trainable"] and all(".lora_" in n for n in one["trainable"])
    assert len(one["trainable"]) == 2 * 4 * 2  # A and B x 4 targets x 2 layers
    assert one["optimizer_params"] == len(one["trainable"])
    assert one["base_before"] == one["base_after"]
    assert min(one["adapter_moved"].values()) > 0  # every adapter matrix moved in 3 steps
    for rank in two:
        for name in TWO:
            assert rank[name]["base_before"] == rank[name]["base_after"]


@pytest.mark.parametrize("name", sorted(TWO))
def test_adapter_gradients_and_merged_weights_match_tp1(one, two, name):
    got = two[0][name]
    assert got["losses"] == pytest.approx(one["losses"], abs=1e-5)
    assert len(got["grads"]) == len(one["grads"]) == 3
    for ga, gb in zip(one["grads"], got["grads"], strict=True):
        assert set(ga) == set(gb)
        assert max(float(np.abs(ga[k] - gb[k]).max()) for k in ga) < 1e-5
    assert max(float(np.abs(g).max()) for g in one["grads"][-1].values()) > 1e-3  # not trivially zero
    merged = got["merged"]
    assert max(float(np.abs(one["merged"][k] - merged[k]).max()) for k in one["merged"]) < 1e-5


def test_merged_weights_are_base_plus_adapters(one, model_dir):
    from asp_npu.trainer.convert import read_hf_state

    base = {k: v.numpy() for k, v in read_hf_state(model_dir).items()}
    merged = one["merged"]
    assert set(merged) == set(base)
    for k in merged:
        moved = float(np.abs(merged[k] - base[k]).max())
        if k.endswith("_proj.weight"):  # q/k/v/o, gate/up/down: W + alpha/r B A
            assert moved > 0, k
        else:  # embeddings, norms, q/k/v biases: frozen, no adapter
            assert moved == 0, k
