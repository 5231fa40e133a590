"""Bad parallel layouts fail with one clear error before any process group or actor starts."""

from __future__ import annotations

import json

import pytest

from asp_npu.errors import ConfigError
from asp_npu.trainer.parallel import ModelDims, check_layout, layout_problems

DIMS = ModelDims(hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                 vocab_size=203, rms_norm_eps=1e-6, rope_theta=1e4, max_position_embeddings=256,
                 tie_word_embeddings=True)


def test_valid_layouts():
    assert check_layout(DIMS, 2, 2, 1, 4).world_size == 4
    assert layout_problems(DIMS, 1, 1, 2, 2) == []


@pytest.mark.parametrize(("tp", "pp", "dp", "world", "needle"), [
    (3, 1, 1, 3, "does not divide the 4 attention heads"),
    (4, 1, 1, 4, "does not divide the 2 key/value heads"),
    (1, 3, 1, 3, "larger than the 2 layers"),
    (1, 1, 1, 2, "world size 2 != "),
    (0, 1, 1, None, "must be >= 1"),
])
def test_bad_layouts_are_named(tp, pp, dp, world, needle):
    with pytest.raises(ConfigError, match=needle):
        check_layout(DIMS, tp, pp, dp, world)


def test_every_problem_is_listed_at_once():
    problems = layout_problems(DIMS, 3, 4, 1, 5)
    assert len(problems) >= 3
    joined = "; ".join(problems)
    assert "attention heads" in joined and "layers" in joined and "world size 5" in joined


def test_trainer_group_rejects_bad_layout_before_ray_starts(tmp_path):
    import ray

    from asp_npu.config import Config
    from asp_npu.trainer.group import TrainerGroup

    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 203}))
    cfg = Config()
    cfg.model.path = str(tmp_path)
    cfg.trainer.device = "cpu"
    cfg.actor_config.tensor_model_parallel_size = 3
    cfg.actor_config.pipeline_model_parallel_size = 4
    was_up = ray.is_initialized()
    with pytest.raises(ConfigError) as err:
        TrainerGroup(cfg, world_size=7)
    msg = str(err.value)
    assert "attention heads" in msg and "larger than the 2 layers" in msg and "world size 7" in msg
    assert ray.is_initialized() == was_up  # nothing was started


def test_missing_config_json_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        ModelDims.from_hf_dir(tmp_path)
