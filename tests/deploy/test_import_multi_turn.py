"""MindSpeed-RL's multi-turn config and verl's multi_turn keys import to the `multi_turn` section, and the
shipped `dapo_qwen25_7b_A2_multi_turn` passes `check` (it was refused in one line before issue 29)."""

from __future__ import annotations

from pathlib import Path

from asp_npu.cli import main as cli_main
from asp_npu.config import load_config
from asp_npu.deploy.import_config import translate_verl_multi_turn

FIXTURE = Path(__file__).parent / "fixtures" / "dapo_qwen25_7b_A2_multi_turn.yaml"


def test_mindspeed_multi_turn_config_imports_and_passes_check(tmp_path: Path, capsys) -> None:
    out = tmp_path / "ours.yaml"
    assert cli_main(["import-config", "mindspeed-rl", str(FIXTURE), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for key in ("multi_turn_enable", "tool_config_path", "max_tool_calls", "max_parallel_calls",
                "max_total_response_length", "max_tool_response_length", "tool_response_truncate_side",
                "tool_parser_format"):
        assert f"not mapped: rl_config.{key}:" not in printed
    mt = load_config(str(out), check=False).multi_turn
    assert mt.enable and mt.tool_config_path == "./configs/tools/retool_config.yaml"
    assert (mt.max_tool_calls, mt.max_parallel_calls, mt.max_total_response_length) == (1, 1, 2048)
    assert (mt.max_tool_response_length, mt.tool_response_truncate_side) == (256, "middle")
    assert mt.format == "hermes"
    assert load_config(str(out), check=False).reward.verifier_function == ["retool_reward"]
    assert cli_main(["check", "--config", str(out)]) == 0
    assert "OK:" in capsys.readouterr().out


def test_verl_multi_turn_keys() -> None:
    tr = translate_verl_multi_turn({"enable": True, "max_assistant_turns": 5, "max_user_turns": 4,
                                    "tool_config_path": "tools.yaml", "format": "hermes",
                                    "interaction_config_path": "x.yaml", "use_inference_chat_template": True})
    assert tr.out == {"multi_turn": {"enable": True, "max_assistant_turns": 5, "max_tool_calls": 4,
                                     "tool_config_path": "tools.yaml", "format": "hermes"}}
    skipped = dict(tr.unmapped)
    assert "interaction agents" in skipped["actor_rollout_ref.rollout.multi_turn.interaction_config_path"]
    assert "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template" in skipped


def test_retool_reward_is_mindspeeds_strict_box_rule() -> None:
    from asp_npu.data.verifiers import MINDSPEED_VERIFIERS

    f = MINDSPEED_VERIFIERS["retool_reward"]
    assert f("so the answer is \\boxed{42}", "42") == 1.0
    assert f("\\boxed{42}" + " " * 120, "42") == -1.0  # only the last 100 characters count
    assert f("\\boxed{41}", "42") == -1.0 and f("42", "42") == -1.0
