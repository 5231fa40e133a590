"""The one-page report is drawn from the run directory's files alone, and redrawn by the CLI."""

from __future__ import annotations

import json

import pytest

from asp_npu.cli import main as cli_main
from asp_npu.core import run_dir as rd
from asp_npu.errors import UserError
from asp_npu.observe import metrics as m
from asp_npu.observe.report import draw_report


def _fake_run(tmp_path):
    run = rd.RunDir.create(tmp_path / "run", "rl_config:\n  mode: asp\n")
    with m.MetricsLogger(run.path, loggers=["jsonl"]) as log:
        for step in range(1, 6):
            log.log(step, {m.REWARD_MEAN: 0.1 * step, m.E2E_TPS: 100.0 + step, m.VLLM_TPS: 300.0,
                           m.QUEUE_OCCUPANCY: step % 3, m.LAG_MEAN: 0.5, m.LAG_MAX: 1,
                           m.TIMING_ITERATION: 2.0, m.RESPONSE_LEN_MEAN: 20.0 + step})
    run.write_jsonl(rd.QUEUE, [{"t": 10.0 + i, "occupancy": i % 4} for i in range(10)])
    run.write_jsonl(rd.SAMPLES, [{"step": s, "policy_version": s - (i % 2)}
                                 for s in range(5) for i in range(4)])
    run.write_summary({"mode": "asp", "max_lag": 1, "throughput_tokens_per_s": 103.0,
                       "bubbles": {"utilization": 0.7, "padding": 0.1, "skewness": 0.15, "sorting": 0.05}})
    return run


def test_report_png_is_drawn(tmp_path):
    run = _fake_run(tmp_path)
    path = draw_report(run.path)
    assert path == run.path / rd.REPORT
    assert path.stat().st_size > 10_000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_cli_redraws_and_rejects_non_runs(tmp_path, capsys):
    run = _fake_run(tmp_path)
    out = tmp_path / "again.png"
    assert cli_main(["report", str(run.path), "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000 and str(out) in capsys.readouterr().out
    assert cli_main(["report", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    with pytest.raises(UserError, match="not a run directory"):
        draw_report(tmp_path)


def test_report_from_metrics_only(tmp_path):
    """A run that crashed early has only metrics.jsonl: the report still draws (lag from metrics)."""
    folder = tmp_path / "crashed"
    with m.MetricsLogger(folder, loggers=["jsonl"]) as log:
        log.log(1, {m.REWARD_MEAN: 0.0, m.LAG_MEAN: 0.0, m.LAG_MAX: 0, "bubbles/padding": 0.2})
    assert draw_report(folder).stat().st_size > 0


def test_run_dir_reuse_keeps_user_files(tmp_path):
    run = _fake_run(tmp_path)
    (run.path / "notes.txt").write_text("mine")
    again = rd.RunDir.create(run.path, "x: 1\n")
    assert (again.path / "notes.txt").read_text() == "mine"
    assert not (again.path / rd.METRICS).exists() and not (again.path / rd.SUMMARY).exists()
    assert (again.path / rd.CONFIG).read_text() == "x: 1\n"
    assert json.loads(json.dumps(again.read_summary())) == {}
