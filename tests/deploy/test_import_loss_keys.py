"""MindSpeed-RL's loss keys import to the loss they describe: entropy bonus, KL control and placement,
token-level or per-sequence aggregation, no dual clip, and no behaviour weight under nucleus sampling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from asp_npu.cli import main as cli_main
from asp_npu.config import load_config, validate

FIXTURE = Path(__file__).parent / "fixtures" / "grpo_qwen25_7b_A3.yaml"


def _import(tmp_path: Path, capsys: pytest.CaptureFixture[str], rl: dict[str, Any],
            sampling: dict[str, Any] | None = None) -> tuple[Any, str]:
    ms = OmegaConf.to_container(OmegaConf.load(FIXTURE))
    ms["rl_config"].update(rl)
    ms["generate_config"]["sampling_config"].update(sampling or {})
    src, out = tmp_path / FIXTURE.name, tmp_path / "ours.yaml"
    src.write_text(OmegaConf.to_yaml(OmegaConf.create(ms)))
    args = ["import-config", "mindspeed-rl", str(src), "--out", str(out), "--mode", "mindspeed-sync"]
    assert cli_main(args) == 0
    printed = capsys.readouterr().out
    cfg = load_config(str(out), check=False)
    # model.path and the Megatron weights of the imported file live on the cluster, not here
    assert [p for p in validate(cfg) if not p.startswith(("model.path", "model.load_megatron"))] == []
    return cfg, printed


def test_entropy_kl_control_and_placement_are_mapped(tmp_path, capsys):
    cfg, printed = _import(tmp_path, capsys, {"entropy_coeff": 0.001, "kl_ctrl_type": "adaptive",
                                              "use_kl_in_reward": True, "kl_horizon": 500, "kl_target": 0.05,
                                              "token_level_loss": False, "kl_penalty": "abs"})
    rl = cfg.rl_config
    assert (rl.entropy_coeff, rl.kl_ctrl_type, rl.use_kl_in_reward) == (0.001, "adaptive", True)
    assert (rl.kl_horizon, rl.kl_target, rl.kl_coef, rl.kl_penalty) == (500, 0.05, 0.001, "abs")
    assert rl.loss_agg_mode == "seq-mean-token-mean" and rl.clip_ratio_c == 0.0  # MindSpeed-RL: no dual clip
    for key in ("entropy_coeff", "kl_ctrl_type", "use_kl_in_reward", "kl_horizon", "kl_target",
                "token_level_loss"):
        assert f"not mapped: rl_config.{key}" not in printed, key


def test_adaptive_control_without_kl_in_the_reward_stays_fixed_as_in_mindspeed(tmp_path, capsys):
    cfg, printed = _import(tmp_path, capsys, {"kl_ctrl_type": "adaptive", "token_level_loss": True})
    assert cfg.rl_config.kl_ctrl_type == "fixed" and not cfg.rl_config.use_kl_in_reward
    assert cfg.rl_config.loss_agg_mode == "token-mean"
    assert "kl_ctrl_type adaptive -> fixed" in printed


def test_nucleus_sampling_turns_the_behaviour_weight_off(tmp_path, capsys):
    cfg, printed = _import(tmp_path, capsys, {}, {"top_p": 0.9})
    assert cfg.generate_config.sampling_config.top_p == 0.9 and cfg.rl_config.importance_cap == 0.0
    assert "importance_cap 0: top_p 0.9 < 1" in printed
    cfg, _ = _import(tmp_path, capsys, {})
    assert cfg.rl_config.importance_cap == 2.0  # top_p 1: the correction stays on
