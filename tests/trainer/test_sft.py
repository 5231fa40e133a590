"""`asp-npu sft`: the supervised warm-start trains the megatron policy and writes a loadable HF folder."""

from __future__ import annotations

import numpy as np
import pytest

from asp_npu.cli import main as cli_main
from asp_npu.config import Config


def test_sft_cli_reports_bad_config_in_one_line(tmp_path, capsys):
    assert cli_main(["sft", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert cli_main(["sft", "sft.steps=lots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("asp-npu sft: error:") for line in err)
    assert "missing.yaml" in err[0] and "sft.steps" in err[1]


@pytest.mark.slow
def test_sft_warm_start_lowers_loss_and_writes_hf_folder(tiny_model_dir, tmp_path):
    from asp_npu.data.init_model import check_model_dir
    from asp_npu.trainer.convert import read_hf_state
    from asp_npu.trainer.sft import warm_start

    cfg = Config()
    cfg.model.path = str(tiny_model_dir)
    cfg.trainer.device = "cpu"
    cfg.data.num_prompts = 4
    cfg.generate_config.sampling_config.max_tokens = 16
    s = cfg.sft
    s.num_examples, s.batch_size, s.max_items, s.eval_prompts, s.eval_every, s.lr = 64, 8, 3, 4, 0, 3e-3
    cfg.actor_config.micro_batch_size = 8
    result = warm_start(cfg, out_dir=str(tmp_path / "sft"), steps=12, log=lambda msg: None)
    losses = result["losses"]
    assert len(losses) == 12 and np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3])
    assert [e["step"] for e in result["evals"]] == [0, 12]
    assert all(0.0 <= e["exact_match"] <= e["reward"] + 1e-9 <= 1.0 + 1e-9 for e in result["evals"])
    out = check_model_dir(result["out"])
    assert [p.name for p in tmp_path.iterdir()] == ["sft"]  # no temp or evaluation folder left behind
    before, after = read_hf_state(tiny_model_dir), read_hf_state(out)
    assert set(before) == set(after)
    key = "model.layers.0.mlp.up_proj.weight"
    assert not np.allclose(before[key], after[key])
