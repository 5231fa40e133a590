"""PPO with a critic end to end on CPU: `asp-npu train` in mode asp with `rl_config.adv_estimator=gae`
(real vLLM instance, megatron-core trainer and critic ranks over gloo, Ray queue) on a fresh tiny model.

The run records, per step, the critic's value loss and explained variance in verl's names, the critic
version that scored the minibatch and its lag (within `rl_config.max_lag`); the first step is the
critic's warm-up (`trainer.critic_warmup=1`: the policy is not updated), the later ones update both.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from asp_npu.cli import main as cli_main
from asp_npu.core import run_dir as rd
from asp_npu.observe.metrics import read_metrics
from tests.pipeline.test_e2e import OVERRIDES

pytestmark = pytest.mark.slow

ITERS = 3
PPO = ["rl_config.adv_estimator=gae", "rl_config.gamma=1.0", "rl_config.lam=0.95",
       "rl_config.cliprange_value=0.5", "trainer.critic_warmup=1", "critic_config.micro_batch_size=8",
       "critic_config.lr=1e-3",
       # the untrained model earns no task reward; DAPO's overlong penalty gives responses running into
       # the last 8 of 24 tokens a length-dependent negative reward, so returns (and values) are not all 0
       "rl_config.overlong_buffer_enable=true", "rl_config.overlong_buffer=8"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    from asp_npu.data.init_model import build_model_dir

    root = tmp_path_factory.mktemp("ppo")
    model = build_model_dir(root / "tiny", "tiny", seed=0)
    out = root / "run"
    rc = cli_main(["train", "--config", "configs/cpu_tiny.yaml", *OVERRIDES, "rl_config.mode=asp",
                   "rl_config.global_batch_size=2", "generate_config.num_instances=1",
                   f"trainer.train_iters={ITERS}", "trainer.logger=[jsonl]", "trainer.save_freq=0",
                   f"model.path={model}", f"trainer.run_dir={out}", *PPO])
    assert rc == 0
    return out


def test_ppo_trains_the_policy_and_the_critic_with_lag_in_bound(run):
    summary = json.loads((run / rd.SUMMARY).read_text())
    rows = [r for r in read_metrics(run / rd.METRICS) if "critic/vf_loss" in r]
    assert summary["steps"] == ITERS and len(rows) == ITERS
    for r in rows:
        for key in ("critic/vf_loss", "critic/vf_explained_var", "critic/vpred_mean", "critic/lag"):
            assert math.isfinite(r[key]), (key, r)
        assert 0 <= r["critic/lag"] <= summary["max_lag"]
    print("PPO run:", [{k: round(r[k], 4) for k in ("critic/vf_loss", "critic/vf_explained_var",
                                                    "critic/vpred_mean", "critic/lag", "actor/skipped")}
                       for r in rows])
    assert [r["critic/version"] for r in rows] == [1.0, 2.0, 3.0]
    assert [r["critic/scored_by"] for r in rows] == [0.0, 1.0, 2.0]
    assert rows[0]["critic/warmup"] == 1.0 and rows[0]["actor/skipped"] == 1.0  # warm-up: critic only
    assert all(r["critic/warmup"] == 0.0 and r["actor/skipped"] == 0.0 for r in rows[1:])
    assert rows[0]["critic/vpred_mean"] == 0.0  # the zero-initialised head scores 0 before its first update
    assert any(r["critic/returns_mean"] != 0.0 for r in rows)  # something to learn ...
    assert any(r["critic/vpred_mean"] != 0.0 for r in rows[1:])  # ... and the critic learns it
    assert all(r["critic/vf_loss"] > 0 for r in rows)
    assert (run / "logs" / "critic-rank0.log").is_file()
    # the end-of-run checkpoint holds the critic beside the trainer (resume restores both)
    assert (run / "checkpoints" / f"iter_{ITERS:07d}" / "critic" / "latest.json").is_file()
