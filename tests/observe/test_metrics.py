"""The metrics logger writes the same rows to JSONL, TensorBoard and the console line."""

from __future__ import annotations

import io
import json
import math

import pytest

from asp_npu.observe import metrics as m


def _tb_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_jsonl_tensorboard_and_console_agree(tmp_path):
    out = io.StringIO()
    rows = [
        {m.REWARD_MEAN: 0.25, m.E2E_TPS: 1234.5, m.LAG_MEAN: 0.5, m.LAG_MAX: 1, m.QUEUE_OCCUPANCY: 16,
         m.TIMING_ITERATION: 2.0, "bubbles/padding": 0.1, "mode": "asp"},
        {m.REWARD_MEAN: 0.5, m.E2E_TPS: 2000.0, m.LAG_MEAN: 1.0, m.LAG_MAX: 1, m.QUEUE_OCCUPANCY: 0,
         m.TIMING_ITERATION: 1.5, "bubbles/padding": float("nan")},
    ]
    with m.MetricsLogger(tmp_path, total_steps=4, max_lag=1, stream=out) as log:
        for step, row in enumerate(rows, 1):
            log.log(step, row)
    got = m.read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in got] == [1, 2]
    assert got[0][m.REWARD_MEAN] == 0.25 and got[0]["mode"] == "asp"
    assert math.isnan(got[1]["bubbles/padding"])
    scalars = _tb_scalars(tmp_path / "tensorboard")
    assert scalars[m.REWARD_MEAN] == [(1, 0.25), (2, 0.5)]
    assert [s for s, _ in scalars["bubbles/padding"]] == [1]  # NaN is not plotted; strings never
    assert "mode" not in scalars
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "step 1/4" in lines[0] and "reward 0.250" in lines[0] and "1,234 tok/s" in lines[0]
    assert "lag 0.50 (max 1/1)" in lines[0] and "queue 16" in lines[0]
    assert lines[1].startswith("[" + "#" * 10 + "." * 10 + "]")


def test_only_selected_sinks(tmp_path):
    out = io.StringIO()
    with m.MetricsLogger(tmp_path, loggers=["jsonl"], stream=out) as log:
        log.log(1, {m.REWARD_MEAN: 1.0})
    assert out.getvalue() == ""
    assert not (tmp_path / "tensorboard").exists()
    assert json.loads((tmp_path / "metrics.jsonl").read_text())[m.REWARD_MEAN] == 1.0
    with pytest.raises(ValueError, match="mlflow"):
        m.MetricsLogger(tmp_path, loggers=["mlflow"])


def test_wandb_and_swanlab_log_offline_without_network(tmp_path, monkeypatch):
    """No API key and no mode set: both loggers run offline and keep every step in the run directory."""
    for env in ("WANDB_MODE", "WANDB_API_KEY", "SWANLAB_MODE", "SWANLAB_API_KEY"):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    with m.MetricsLogger(tmp_path, loggers=["jsonl", "wandb", "swanlab"], project="asp-test",
                         experiment="offline") as log:
        for step in (1, 2, 3):
            log.log(step, {m.REWARD_MEAN: step / 10, "val/reward/gsm8k": 0.5, "note": "text"})
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0
    labs = list((tmp_path / "swanlog").glob("run-*/run-*.swanlab"))
    assert len(labs) == 1 and labs[0].stat().st_size > 0
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


def test_torn_last_line_is_skipped(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "reward/mean": 0.1}\n{"step": 2, "rew')
    assert [r["step"] for r in m.read_metrics(p)] == [1]


def test_progress_line_without_optional_fields():
    assert m.progress_line(3, 0, {}) == "step 3"
