"""Uneven pipeline stages (MindSpeed's num_layer_list / noop_layers as megatron-core's
`pipeline_model_parallel_layout`): a 3-layer model split 1+2 or 2+1 over PP=2 trains exactly as PP=1."""

from __future__ import annotations

import numpy as np
import pytest

from tests.trainer import jobs
from tests.trainer.helpers import make_hf_model, run_ranks

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_hf_model(tmp_path_factory.mktemp("hf") / "three", tied=True, layers=3))


@pytest.fixture(scope="module")
def one(model_dir):
    return run_ranks(1, jobs.stage_parity, model_dir, [])[0]


@pytest.mark.parametrize("stages", [[1, 2], [2, 1]], ids=["1+2", "2+1"])
def test_uneven_stages_give_the_pp1_losses_and_gradients(model_dir, one, stages):
    ranks = run_ranks(2, jobs.stage_parity, model_dir, stages)
    assert [r["layers"] for r in ranks] == [list(range(stages[0])), list(range(stages[0], 3))]
    assert len(set(one["losses"])) == 3  # every update changed the policy
    for r in ranks:
        assert r["losses"] == pytest.approx(one["losses"], abs=1e-5)
    for step in range(3):
        merged = {**ranks[0]["grads"][step], **ranks[1]["grads"][step]}
        want = one["grads"][step]
        assert set(merged) == set(want)
        assert max(float(np.abs(merged[k] - want[k]).max()) for k in want) < 1e-5
