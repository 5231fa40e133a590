"""MindSpeed-RL's DAPO, data and logger keys import to the asp-npu keys that honour them."""

from __future__ import annotations

import shutil
from pathlib import Path

from omegaconf import OmegaConf

from asp_npu.cli import main as cli_main
from asp_npu.config import load_config

FIXTURE = Path(__file__).parent / "fixtures" / "grpo_qwen25_7b_A3.yaml"


def test_dapo_data_and_logger_keys_are_mapped(tmp_path: Path, capsys) -> None:
    ms = OmegaConf.to_container(OmegaConf.load(FIXTURE))
    ms["rl_config"].update({"filter_groups_enable": True, "filter_groups_max_batches": 4,
                            "overlong_buffer_enable": True, "overlong_buffer": 512,
                            "overlong_buffer_penalty_factor": 0.5, "use_wandb": True, "use_swanlab": True,
                            "wandb_project": "dapo", "wandb_exp_name": "qwen7b"})
    ms["megatron_training"]["map_keys"] = {"prompt": "Problem", "query": "", "response": "Answer",
                                           "system": ""}
    src = tmp_path / "src" / FIXTURE.name
    src.parent.mkdir()
    shutil.copytree(FIXTURE.parent / "model", src.parent / "model")
    src.write_text(OmegaConf.to_yaml(OmegaConf.create(ms)))
    out = tmp_path / "ours.yaml"
    assert cli_main(["import-config", "mindspeed-rl", str(src), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for key in ("overlong_buffer", "filter_groups_max_batches", "use_wandb", "use_swanlab", "map_keys",
                "wandb_project"):
        assert f"not mapped: rl_config.{key}:" not in printed
        assert f"not mapped: megatron_training.{key}:" not in printed
    cfg = load_config(str(out), check=False)
    rl = cfg.rl_config
    assert rl.drop_equal_reward_groups and rl.filter_groups_max_batches == 4
    overlong = (rl.overlong_buffer_enable, rl.overlong_buffer, rl.overlong_buffer_penalty_factor)
    assert overlong == (True, 512, 0.5)
    assert cfg.data.map_keys == {"prompt": "Problem", "query": "", "response": "Answer", "system": ""}
    assert cfg.trainer.logger == ["console", "jsonl", "tensorboard", "wandb", "swanlab"]
    assert (cfg.trainer.project_name, cfg.trainer.experiment_name) == ("dapo", "qwen7b")


def test_no_cap_on_filtered_batches_imports_as_written(tmp_path: Path) -> None:
    """MindSpeed-RL's shipped DAPO configs write `filter_groups_max_batches: -1` (no cap): it imports and
    validates (it was refused as out of range), and the run filters without a cap."""
    from asp_npu.config import validate
    from asp_npu.data.shaping import filter_budget
    from tests.deploy.mindspeed_fixture import import_edited

    cfg = import_edited(tmp_path, {"filter_groups_enable": True, "filter_groups_max_batches": -1})
    assert cfg.rl_config.filter_groups_max_batches == -1
    assert not [p for p in validate(cfg) if "filter_groups_max_batches" in p]
    assert filter_budget(cfg.rl_config.filter_groups_max_batches, 32, 10) is None
