"""An existing run directory survives a refused start; torn run files and failed report writes cost one
line and leave nothing behind."""

from __future__ import annotations

import os

import pytest

from asp_npu.config import Config
from asp_npu.core import run_dir as rd
from asp_npu.errors import UserError
from asp_npu.observe import metrics as m
from asp_npu.observe.report import draw_report
from asp_npu.pipeline.train import train


def _previous_run(tmp_path):
    run = rd.RunDir.create(tmp_path / "run", "old: 1\n")
    with m.MetricsLogger(run.path, loggers=["jsonl"]) as log:
        log.log(1, {m.REWARD_MEAN: 0.5})
    run.write_summary({"mode": "asp", "max_lag": 1})
    (run.checkpoints / "final").mkdir()
    (run.checkpoints / "final" / "latest.json").write_text("{}")
    return run


def _snapshot(path):
    return sorted((str(p.relative_to(path)), p.read_bytes() if p.is_file() else b"")
                  for p in path.rglob("*"))


def test_reuse_refuses_previous_checkpoints_unless_overwrite_or_resume(tmp_path):
    run = _previous_run(tmp_path)
    problem = rd.RunDir.reuse_problem(run.path)
    assert problem and "--overwrite" in problem and "trainer.run_dir" in problem
    assert rd.RunDir.reuse_problem(run.path, overwrite=True) is None
    assert rd.RunDir.reuse_problem(run.path, keep_checkpoints=True) is None
    before = _snapshot(run.path)
    with pytest.raises(UserError, match="--overwrite"):
        rd.RunDir.create(run.path, "new: 1\n")
    assert _snapshot(run.path) == before
    again = rd.RunDir.create(run.path, "new: 1\n", overwrite=True)
    assert not any(again.checkpoints.iterdir()) and not (again.path / rd.METRICS).exists()


@pytest.mark.parametrize("with_checkpoints", [True, False])
def test_refused_train_leaves_the_previous_run_untouched(tmp_path, with_checkpoints):
    """A new run with a wrong data path (or into a run with checkpoints) fails before touching the folder."""
    run = _previous_run(tmp_path)
    if not with_checkpoints:
        (run.checkpoints / "final" / "latest.json").unlink()
        (run.checkpoints / "final").rmdir()
    before = _snapshot(run.path)
    cfg = Config()
    cfg.trainer.run_dir = str(run.path)
    cfg.data.data_path = str(tmp_path / "missing.jsonl")
    cfg.model.path = str(tmp_path / "no_model")
    with pytest.raises(UserError) as exc:
        train(cfg, "cpu")
    assert ("--overwrite" in str(exc.value)) == with_checkpoints
    assert "\n" not in str(exc.value)
    assert _snapshot(run.path) == before
    assert not (tmp_path / "no_model").exists()  # nothing built before the refusal


@pytest.mark.parametrize(("name", "text", "match"), [
    (rd.METRICS, '[1, 2]\n', "not a JSON object"),
    (rd.METRICS, '{"step": "one"}\n', "'step'"),
    (rd.METRICS, b'\xff\xfe{"step"', "UTF-8"),
    (rd.QUEUE, '{"t": 1.0, "occ', "not a JSON line"),
    (rd.QUEUE, '{"t": 1.0}\n', "'occupancy'"),
    (rd.SAMPLES, '{"step": 1, "policy_version": null}\n', "'policy_version'"),
    (rd.SUMMARY, '{"mode": "asp", ', "not valid JSON"),
    (rd.SUMMARY, '[]', "expected a JSON object"),
    (rd.SUMMARY, '{"throughput_tokens_per_s": "fast"}', "not a number"),
])
def test_report_refuses_torn_or_mistyped_files(tmp_path, name, text, match):
    run = rd.RunDir.create(tmp_path / "run", "x: 1\n")
    (run.path / rd.METRICS).write_text('{"step": 1, "reward/mean": 0.1}\n')
    target = run.path / name
    target.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(UserError, match=match) as exc:
        draw_report(run.path)
    assert "\n" not in str(exc.value) and name in str(exc.value)
    assert not (run.path / rd.REPORT).exists()


def test_failed_report_write_leaves_no_temp_file(tmp_path, monkeypatch):
    run = rd.RunDir.create(tmp_path / "run", "x: 1\n")
    (run.path / rd.METRICS).write_text('{"step": 1, "reward/mean": 0.1}\n')

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(UserError, match="No space left"):
        draw_report(run.path)
    assert sorted(p.name for p in run.path.iterdir()) == sorted([rd.CONFIG, rd.METRICS, rd.PLANS,
                                                                 rd.CHECKPOINTS])
