"""The trainer as a Ray actor group (TP=2): weight export, checkpoint and exact resume."""

from __future__ import annotations

import numpy as np
import pytest

from asp_npu.trainer.convert import load_safetensors_bytes, read_hf_state
from asp_npu.trainer.group import TrainerGroup
from tests.trainer.helpers import make_batch, make_hf_model, trainer_config

pytestmark = pytest.mark.slow


def test_tp2_group_exports_hf_weights_and_resumes_exactly(tmp_path):
    model = make_hf_model(tmp_path / "hf", tied=True)
    cfg = trainer_config(model, tp=2)
    batch = make_batch(seed=3)
    group = TrainerGroup(cfg)
    try:
        initial = group.get_hf_weights()
        ref = read_hf_state(model)
        assert initial.version == 0 and set(initial.tensors) == set(ref)
        assert all(np.array_equal(initial.tensors[k], ref[k].numpy()) for k in ref)
        group.train_step(batch)
        group.save(str(tmp_path / "ckpt"))
        uninterrupted = group.train_step(batch)
        after = group.get_hf_weights()
    finally:
        group.shutdown()
    assert after.version == 2 and group.version == 2
    assert not np.array_equal(after.tensors["model.layers.0.self_attn.q_proj.weight"],
                              initial.tensors["model.layers.0.self_attn.q_proj.weight"])
    blob = load_safetensors_bytes(after.to_safetensors_bytes())
    assert np.array_equal(blob["model.norm.weight"].numpy(), after.tensors["model.norm.weight"])

    resumed_group = TrainerGroup(cfg)
    try:
        meta = resumed_group.load(str(tmp_path / "ckpt"))
        assert meta["step"] == 1 and resumed_group.version == 1
        resumed = resumed_group.train_step(batch)
        again = resumed_group.get_hf_weights()
    finally:
        resumed_group.shutdown()
    assert resumed["loss"] == uninterrupted["loss"]
    assert resumed["grad_norm"] == uninterrupted["grad_norm"]
    assert again.version == 2
    assert all(np.array_equal(again.tensors[k], after.tensors[k]) for k in after.tensors)
