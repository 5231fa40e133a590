"""Multi-turn GRPO with a tool, end to end on CPU (issue 29): `asp-npu sft` teaches the tiny model the
calc task's call format, then `asp-npu train` in mode asp runs real vLLM multi-turn rollouts that call
the sandboxed calculator, and the megatron-core trainer consumes them.

Checked from what the run recorded: the tool-call metrics of every step, calls actually made and
answered, every token of every consumed sample within the lag bound (samples.jsonl's per-token change
points), and every sample consumed once.
"""

from __future__ import annotations

import json

import pytest

from asp_npu.cli import main as cli_main
from asp_npu.core import run_dir as rd

pytestmark = pytest.mark.slow

CONFIG = "configs/cpu_calc_multi_turn.yaml"
SMALL = ["data.num_prompts=16", "rl_config.global_batch_size=4", "rl_config.mini_batch_size=16",
         "rl_config.n_samples_per_prompt=4", "generate_config.max_num_seqs=16", "trainer.stall_timeout_s=240"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from asp_npu.data.init_model import build_model_dir

    root = tmp_path_factory.mktemp("e2e_multi_turn")
    model = build_model_dir(root / "tiny", "tiny", seed=0)
    sft = root / "sft"
    assert cli_main(["sft", "--config", CONFIG, "--out", str(sft), f"model.path={model}",
                     "sft.eval_prompts=8"]) == 0
    out = root / "run"
    assert cli_main(["train", "--config", CONFIG, f"model.path={sft}", "trainer.train_iters=2",
                     f"trainer.run_dir={out}", *SMALL]) == 0
    return out


def test_tool_calls_are_made_answered_and_logged(run):
    metrics = [json.loads(line) for line in (run / rd.METRICS).read_text().splitlines()]
    steps = [m for m in metrics if "multi_turn/tool_calls_per_traj" in m]
    assert len(steps) == 2
    for m in steps:
        for key in ("multi_turn/tool_success_rate", "multi_turn/turns_mean", "multi_turn/tool_token_share"):
            assert key in m
    assert max(m["multi_turn/tool_calls_per_traj"] for m in steps) > 0  # the warm-started model calls
    assert max(m["multi_turn/turns_mean"] for m in steps) > 1  # and goes on after the tool's turn
    assert max(m["multi_turn/tool_success_rate"] for m in steps) > 0


def test_every_token_within_the_lag_bound_and_every_sample_once(run):
    summary = json.loads((run / rd.SUMMARY).read_text())
    samples = [json.loads(line) for line in (run / rd.SAMPLES).read_text().splitlines()]
    assert len(samples) == 2 * 16 and summary["max_lag"] == 1
    for s in samples:
        ch = s["version_changes"]
        for k, (lo, v) in enumerate(ch):
            assert 0 <= s["step"] - v <= summary["max_lag"], s
            assert lo < (ch[k + 1][0] if k + 1 < len(ch) else max(1, s["response_len"])), s
    keys = [(s["prompt_id"], s["epoch"], s["sample_idx"]) for s in samples]
    assert len(keys) == len(set(keys))


def test_the_planner_predicted_with_the_trajectory_predictor(run):
    """The run's predictor is the trajectory one, fed whole trajectories: turns and tool waits seen."""
    pred = json.loads((run / rd.SUMMARY).read_text())["predictor"]
    assert pred["name"] == "trajectory" and pred["tokens"] == "history" and pred["step_s"] > 0
    assert 0 < pred["trajectories"] <= 2 * 16 and pred["trajectories"] % 4 == 0  # whole groups, at most once
    assert pred["turns_mean"] > 1 and pred["tool_wait_s_mean"] > 0  # calls made, the calculator waited on
