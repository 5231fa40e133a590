"""The MoE model trains in the CPU pipeline end to end: `asp-npu train` builds a tiny Qwen3-MoE
(`model.architecture=qwen3-moe`), generates with vLLM, trains with megatron-core MoE layers and
refreshes the instance's weights, for a few steps."""

from __future__ import annotations

import json

import pytest

from asp_npu.cli import main as cli_main
from asp_npu.core import run_dir as rd

pytestmark = pytest.mark.slow


def test_qwen3_moe_trains_in_the_pipeline(tmp_path):
    model, out = tmp_path / "tiny-moe", tmp_path / "run"
    rc = cli_main(["train", "--config", "configs/cpu_tiny.yaml", f"model.path={model}",
                   "model.architecture=qwen3-moe", "model.warm_start_steps=0", "trainer.train_iters=1",
                   f"trainer.run_dir={out}", "data.num_prompts=8", "rl_config.n_samples_per_prompt=4",
                   "rl_config.mini_batch_size=8", "rl_config.global_batch_size=4", "rl_config.max_lag=1",
                   "generate_config.num_instances=1", "generate_config.max_num_seqs=8",
                   "generate_config.sampling_config.max_tokens=16", "actor_config.micro_batch_size=8",
                   "trainer.device=cpu", "trainer.stall_timeout_s=120"])
    assert rc == 0
    assert json.loads((model / "config.json").read_text())["model_type"] == "qwen3_moe"
    summary = json.loads((out / rd.SUMMARY).read_text())
    assert summary["steps"] == 2
    rows = [json.loads(line) for line in (out / rd.METRICS).read_text().splitlines()]
    aux = [r[k] for r in rows for k in r if k.endswith("moe_aux_loss")]
    assert aux and all(a > 0 for a in aux)
