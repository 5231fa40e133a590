"""Validation's pure parts: when it runs, its sampling, its per-source metrics; and the report's table."""

from __future__ import annotations

import pytest

from asp_npu.config import Config
from asp_npu.observe.report import validation_lines, validation_sources
from asp_npu.pipeline.validation import val_due, val_metrics, val_sampling
from asp_npu.types import PromptItem, Trajectory


def test_due_every_test_freq_steps_and_at_the_end():
    assert [s for s in range(0, 11) if val_due(s, 10, 3)] == [3, 6, 9, 10]
    assert not any(val_due(s, 10, f) for s in range(11) for f in (0, -1))


def test_greedy_unless_do_sample():
    cfg = Config()
    s = val_sampling(cfg)
    assert (s.n, s.temperature, s.top_p, s.max_tokens) == (1, 0.0, 1.0, 256)
    vk = cfg.generate_config.val_kwargs
    vk.do_sample, vk.temperature, vk.top_p, vk.n = True, 0.6, 0.9, 4
    s = val_sampling(cfg)
    assert (s.n, s.temperature, s.top_p) == (4, 0.6, 0.9)


def _t(pid: str, reward: float) -> Trajectory:
    return Trajectory(pid, 0, [1], [2], [-0.1], "stop", reward, 0)


def test_reward_and_accuracy_per_data_source():
    items = [PromptItem("a", meta={"data_source": "gsm8k"}), PromptItem("b", meta={"data_source": "gsm8k"}),
             PromptItem("c", meta={"data_source": "math"})]
    m = val_metrics(items, [_t("a", 1.0), _t("b", 0.0), _t("c", 0.5), _t("c", 1.0)])
    assert m["val/reward/gsm8k"] == 0.5 and m["val/acc/gsm8k"] == 0.5
    assert m["val/reward/math"] == 0.75 and m["val/acc/math"] == 0.5
    assert m["val/reward/all"] == pytest.approx(2.5 / 4) and m["val/acc/all"] == 0.5
    assert m["val/samples"] == 4


def test_report_lists_validation_per_source():
    rows = [{"step": 1, "reward/mean": 0.1},
            {"step": 2, "val/reward/gsm8k": 0.5, "val/acc/gsm8k": 0.25, "val/reward/all": 0.5}]
    assert validation_sources(rows) == ["gsm8k", "all"]
    assert validation_lines(rows) == ["step 2  gsm8k  reward 0.500  acc 0.250", "step 2  all  reward 0.500"]
