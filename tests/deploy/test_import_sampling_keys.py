"""MindSpeed-RL's `filter_groups_metric`, `top_k` and `min_p` import to the asp-npu keys that honour them;
top_k and min_p truncate the sampled distribution, so they are refused with the importance correction on, as
top_p < 1 is."""

from __future__ import annotations

from pathlib import Path

import pytest

from asp_npu.config import Config, validate
from tests.deploy.mindspeed_fixture import import_edited


def _import(tmp_path: Path, rl: dict, sampling: dict, capsys) -> tuple[Config, str]:
    return import_edited(tmp_path, rl, sampling), capsys.readouterr().out


def test_filter_metric_names_the_verifier_as_there(tmp_path: Path, capsys) -> None:
    cfg, printed = _import(tmp_path, {"filter_groups_enable": True, "filter_groups_metric": "acc_for_dapo",
                                      "verifier_function": ["acc_for_dapo"], "verifier_weight": [1.0]},
                           {}, capsys)
    assert "not mapped: rl_config.filter_groups_metric" not in printed
    assert cfg.rl_config.filter_groups_metric == "acc_for_dapo" and cfg.rl_config.drop_equal_reward_groups
    assert not [p for p in validate(cfg) if "filter_groups_metric" in p]


def test_missing_filter_metric_takes_mindspeed_default_acc(tmp_path: Path, capsys) -> None:
    cfg, _ = _import(tmp_path, {"filter_groups_enable": True, "verifier_function": ["acc", "format"],
                                "verifier_weight": [1.0, 0.5]}, {}, capsys)
    assert cfg.rl_config.filter_groups_metric == "acc"


def test_top_k_and_min_p_import_and_switch_the_correction_off(tmp_path: Path, capsys) -> None:
    """grpo_qwen3_235b_a22b_A2's sampling (top_k 50, min_p 0.01, top_p 1 here): sampled as written."""
    cfg, printed = _import(tmp_path, {}, {"top_k": 50, "min_p": 0.01, "top_p": 1.0}, capsys)
    sc = cfg.generate_config.sampling_config
    assert (sc.top_k, sc.min_p) == (50, 0.01)
    assert "not mapped: generate_config.sampling_config.top_k" not in printed
    assert cfg.rl_config.importance_cap == 0.0 and "importance_cap 0: top_k 50, min_p 0.01" in printed
    assert not [p for p in validate(cfg) if "sampling_config" in p]


def test_whole_distribution_keeps_the_correction(tmp_path: Path, capsys) -> None:
    cfg, _ = _import(tmp_path, {}, {"top_k": -1, "min_p": 0.0, "top_p": 1.0}, capsys)
    assert cfg.rl_config.importance_cap == 2.0 and cfg.generate_config.sampling_config.top_k == -1


@pytest.mark.parametrize(("key", "value", "line"), [
    ("top_k", 50, "generate_config.sampling_config.top_k: 50 > 0 with rl_config.importance_cap > 0"),
    ("min_p", 0.01, "generate_config.sampling_config.min_p: 0.01 > 0 with rl_config.importance_cap > 0"),
    ("top_p", 0.9, "generate_config.sampling_config.top_p: 0.9 < 1 with rl_config.importance_cap > 0"),
])
def test_truncated_sampling_with_the_correction_is_one_line(key, value, line) -> None:
    cfg = Config()
    setattr(cfg.generate_config.sampling_config, key, value)
    problems = [p for p in validate(cfg) if "importance_cap" in p]
    assert len(problems) == 1 and problems[0].startswith(line)
    cfg.rl_config.importance_cap = 0.0
    assert not [p for p in validate(cfg) if "importance_cap" in p]


@pytest.mark.parametrize("top_k", [-1, 0])
def test_top_k_off_values_keep_the_correction(top_k) -> None:
    cfg = Config()
    cfg.generate_config.sampling_config.top_k = top_k
    assert not [p for p in validate(cfg) if "sampling_config" in p]


def test_out_of_range_values_are_refused() -> None:
    cfg = Config()
    cfg.generate_config.sampling_config.top_k = -2
    cfg.generate_config.sampling_config.min_p = 1.5
    problems = validate(cfg)
    assert "generate_config.sampling_config.top_k: must be >= -1 (got -2)" in problems
    assert "generate_config.sampling_config.min_p: must be in [0, 1] (got 1.5)" in problems


def test_vllm_sampling_params_carry_them() -> None:
    """The engine's SamplingParams (vLLM's own class): top_k -1 becomes vLLM's 0 (every token)."""
    from asp_npu.rollout.engine import SamplingSettings
    from asp_npu.rollout.vllm_engine import VLLMEngine
    from asp_npu.types import PromptItem

    eng = VLLMEngine.__new__(VLLMEngine)
    eng.max_model_len = 64
    item = PromptItem("p", prompt_token_ids=[1, 2])
    params = eng._sampling_params(item, [1, 2], 0, SamplingSettings(top_k=50, min_p=0.01, seed=1))
    assert (params.top_k, params.min_p) == (50, 0.01)
    params = eng._sampling_params(item, [1, 2], 0, SamplingSettings())
    assert (params.top_k, params.min_p) == (0, 0.0)
