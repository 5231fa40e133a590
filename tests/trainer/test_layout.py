"""Bad parallel layouts fail with one clear error before any process group or actor starts."""

from __future__ import annotations

import json

import pytest

from asp_npu.arch import ModelDims
from asp_npu.core.layout import check_layout, layout_problems
from asp_npu.errors import ConfigError

DIMS = ModelDims(hidden_size=64, intermediate_size=96, num_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=203,
                 rms_norm_eps=1e-6, rope_theta=1e4, max_position_embeddings=256,
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


MOE = ModelDims(hidden_size=64, intermediate_size=96, num_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=203,
                rms_norm_eps=1e-6, rope_theta=1e4, max_position_embeddings=256,
                tie_word_embeddings=True, model_type="qwen3_moe", num_experts=8, moe_router_topk=2,
                moe_ffn_hidden_size=32)


@pytest.mark.parametrize(("tp", "dp", "ep", "etp", "ok"), [
    (2, 1, 2, 1, True),    # MindSpeed moe_tp_extend_ep TP2 EP1 = megatron EP2 ETP1: folds into TP x DP = 2
    (2, 1, 2, None, False),  # ETP defaults to TP: 2 x 2 = 4 expert ranks > TP x DP = 2
    (2, 2, 4, 1, True),    # EP larger than DP is fine once ETP=1 (megatron parallel folding)
    (1, 2, 2, None, True),
    (1, 3, 2, None, False),
])
def test_expert_layout_follows_megatrons_folding_rule(tp, dp, ep, etp, ok):
    problems = layout_problems(MOE, tp, 1, dp, tp * dp, ep, etp)
    assert (problems == []) is ok, problems
    if not ok:
        assert "does not divide TP x CP x DP" in problems[0]


def test_uneven_stages_must_sum_to_the_layers_and_match_pp():
    assert check_layout(DIMS, 1, 2, 1, 2, stages=(1, 1)).stage_sizes(2) == (1, 1)
    four = ModelDims(**{**DIMS.__dict__, "num_layers": 3})
    assert check_layout(four, 1, 2, 1, 2, stages=(1, 2)).stage_layers(3, 1) == range(1, 3)
    assert "1+1 = 2 layers, but the model has 3" in layout_problems(four, 1, 2, 1, 2, stages=(1, 1))[0]
    assert "2 stages [1, 2] but pipeline_model_parallel_size=3" in layout_problems(four, 1, 3, 1, 3,
                                                                                  stages=(1, 2))[0]
    assert "num_layer_list for uneven stages" in layout_problems(four, 1, 2, 1, 2)[0]


def test_context_parallel_counts_in_the_world_size():
    from asp_npu.config import Config
    from asp_npu.core.shape import trainer_world

    assert check_layout(DIMS, 1, 1, 1, 2, cp=2).world_size == 2
    cfg = Config()
    cfg.actor_config.context_parallel_size, cfg.actor_config.tensor_model_parallel_size = 2, 2
    assert trainer_world(cfg) == 4  # the placement reserves every context-parallel rank
    assert "world size 2 != " in layout_problems(DIMS, 1, 1, 2, 2, cp=2)[0]


def test_validate_takes_cp_on_any_device_refuses_it_for_moe_and_names_bad_stage_lists():
    from asp_npu.config import Config, validate

    cfg = Config()
    cfg.trainer.device = "cpu"
    cfg.actor_config.context_parallel_size = 2
    cfg.actor_config.pipeline_model_parallel_size = 2
    cfg.actor_config.num_layer_list = [1, 1]
    cfg.model.arch.num_layers = 3
    problems = validate(cfg)
    assert not [p for p in problems if "context_parallel" in p]  # the trainer splits sequences over CP
    assert "actor_config.num_layer_list: 1+1 = 2 layers, but the model has 3" in problems
    cfg.actor_config.num_layer_list = [1, 2]
    assert not [p for p in validate(cfg) if "context_parallel" in p or "num_layer_list" in p]
    cfg.model.arch.num_experts = 4
    assert any(p.startswith("actor_config.context_parallel_size: CP2 with a MoE model is not supported yet")
               for p in validate(cfg))


def test_the_trainer_layout_holds_context_parallel_ranks():
    from asp_npu.config import Config
    from asp_npu.core.layout import actor_layout

    act = Config().actor_config
    act.context_parallel_size, act.data_parallel_size = 2, 1
    assert actor_layout(DIMS, act, 2).cp == 2
    with pytest.raises(ConfigError, match="world size 4 != "):
        actor_layout(DIMS, act, 4)
