"""The shipped MindSpeed-RL fixture (grpo_qwen25_7b_A3 and its model/ folder), edited and imported."""

from __future__ import annotations

import shutil
from pathlib import Path

from omegaconf import OmegaConf

from asp_npu.cli import main as cli_main
from asp_npu.config import Config, load_config

FIXTURE = Path(__file__).parent / "fixtures" / "grpo_qwen25_7b_A3.yaml"


def import_edited(tmp_path: Path, rl: dict, sampling: dict | None = None) -> Config:
    """The fixture with `rl_config` / `sampling_config` keys changed, through `import-config mindspeed-rl`
    in mode mindspeed-sync; the imported config, loaded unchecked."""
    ms = OmegaConf.to_container(OmegaConf.load(FIXTURE))
    ms["rl_config"].update(rl)
    ms["generate_config"]["sampling_config"].update(sampling or {})
    src = tmp_path / "src" / FIXTURE.name
    src.parent.mkdir()
    shutil.copytree(FIXTURE.parent / "model", src.parent / "model")
    src.write_text(OmegaConf.to_yaml(OmegaConf.create(ms)))
    out = tmp_path / "ours.yaml"
    assert cli_main(["import-config", "mindspeed-rl", str(src), "--out", str(out), "--mode",
                     "mindspeed-sync"]) == 0
    return load_config(str(out), check=False)
