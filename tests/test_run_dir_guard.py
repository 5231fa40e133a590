"""An existing run directory survives a refused start; torn run files and failed report writes cost one
line and leave nothing behind."""

from __future__ import annotations

import json
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
    assert sorted(p.name for p in run.path.iterdir()) == sorted([rd.CONFIG, rd.METRICS, rd.PLANS, rd.MARKER,
                                                                 rd.CHECKPOINTS])


# ------------------------------------------- replacing a previous run: set aside, then commit or roll back


def _tree_hash(path):
    """One hash over every entry under `path` (names, kinds, file contents): byte-identical or not."""
    import hashlib

    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode() + (b"d" if p.is_dir() else b"f"))
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def _model(tmp_path):
    """A folder that passes check_model_dir (the fake controllers below never load it)."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "qwen2"}')
    (d / "model.safetensors").write_bytes(b"\x02" + b"\0" * 7 + b"{}")  # a valid, empty safetensors file
    (d / "tokenizer_config.json").write_text("{}")
    return d


def _cfg(tmp_path, run):
    cfg = Config()
    cfg.trainer.run_dir = str(run.path)
    cfg.model.path = str(_model(tmp_path))
    cfg.data.num_prompts = 4
    return cfg


class _FakeController:
    """Stands in for the controller (pure logic of the run-directory swap): `steps` trainer steps, then
    `fail` (an exception) or a summary."""

    steps, fail, seen = 0, None, {}

    def __init__(self, cfg, run, prompts, **_kw):
        self.run_dir = run

    def start(self):
        _FakeController.seen["previous"] = self.run_dir.previous

    def run(self):
        with m.MetricsLogger(self.run_dir.path, loggers=["jsonl"]) as log:
            for step in range(1, self.steps + 1):
                log.log(step, {m.REWARD_MEAN: 0.9})
                with open(self.run_dir / rd.SAMPLES, "a") as f:
                    f.write(json.dumps({"step": step, "policy_version": 0}) + "\n")
        if self.fail is not None:
            raise self.fail
        self.run_dir.write_summary({"mode": "asp", "max_lag": 1})
        return {"steps": self.steps}

    def close(self):
        pass


@pytest.fixture
def fake_controller(monkeypatch):
    from asp_npu.pipeline import controller

    monkeypatch.setattr(controller, "Controller", _FakeController)
    _FakeController.steps, _FakeController.fail, _FakeController.seen = 0, None, {}
    return _FakeController


@pytest.mark.parametrize("case", ["bad-data", "torn-model", "no-model", "checkpoints", "overwrite-bad-data",
                                  "nan-lr"])
def test_failed_validation_leaves_the_run_directory_byte_identical(tmp_path, case):
    from asp_npu.pipeline.preflight import preflight

    run = _previous_run(tmp_path)
    (run.path / "notes.txt").write_text("mine")
    (run.path / rd.RUN_LOG).write_text('{"event": "old"}\n')
    cfg = _cfg(tmp_path, run)
    overwrite = case.startswith("overwrite")
    if case in ("bad-data", "overwrite-bad-data"):
        cfg.data.data_path = str(tmp_path / "missing.jsonl")
    if case == "torn-model":
        (tmp_path / "model" / "config.json").write_text('{"model_type": "qw')
    if case == "no-model":
        cfg.model.path, cfg.model.build_if_missing = str(tmp_path / "none"), False
    if case == "nan-lr":
        cfg.actor_config.lr = float("nan")
    if case != "checkpoints":
        overwrite = True  # only the defect under test stands in the way
    before = _tree_hash(tmp_path)
    with pytest.raises(UserError) as exc:
        if case in ("no-model", "nan-lr"):
            preflight(cfg)
        train(cfg, "cpu", overwrite=overwrite)
    assert "\n" not in str(exc.value)
    assert _tree_hash(tmp_path) == before


@pytest.mark.parametrize("where", ["start", "interrupt"])
def test_a_run_failing_before_its_first_step_puts_the_previous_run_back(tmp_path, fake_controller, where):
    run = _previous_run(tmp_path)
    (run.path / "notes.txt").write_text("mine")
    cfg = _cfg(tmp_path, run)
    before = _tree_hash(tmp_path)
    fake_controller.fail = UserError("starting rollout instances failed: no") if where == "start" \
        else KeyboardInterrupt()
    with pytest.raises((UserError, KeyboardInterrupt)):
        train(cfg, "cpu", overwrite=True)
    assert fake_controller.seen["previous"] is not None  # the old files were aside while it ran
    assert _tree_hash(tmp_path) == before


def test_a_new_folder_is_removed_again_when_the_run_fails_before_training(tmp_path, fake_controller):
    fake_controller.fail = UserError("no")
    cfg = _cfg(tmp_path, rd.RunDir(tmp_path / "fresh"))
    with pytest.raises(UserError):
        train(cfg, "cpu")
    assert not (tmp_path / "fresh").exists()


def test_the_previous_run_is_deleted_only_once_the_new_run_has_trained(tmp_path, fake_controller):
    run = _previous_run(tmp_path)
    (run.path / "notes.txt").write_text("mine")
    old_ckpt = run.checkpoints / "final" / "latest.json"
    fake_controller.steps = 2
    summary = train(_cfg(tmp_path, run), "cpu", overwrite=True)
    assert summary == {"steps": 2}
    aside = fake_controller.seen["previous"]
    assert aside.name.startswith(rd.PREVIOUS) and not aside.exists()  # committed
    assert (run.path / "notes.txt").read_text() == "mine" and not old_ckpt.exists()
    assert [p.name for p in run.path.iterdir() if p.name.startswith(rd.PREVIOUS)] == []
    rows = (run.path / rd.METRICS).read_text().splitlines()
    assert len(rows) == 2 and (run.path / rd.REPORT).exists()


def test_a_run_failing_after_training_keeps_its_own_files(tmp_path, fake_controller):
    run = _previous_run(tmp_path)
    fake_controller.steps, fake_controller.fail = 1, RuntimeError("instance lost")
    with pytest.raises(RuntimeError):
        train(_cfg(tmp_path, run), "cpu", overwrite=True)
    assert len((run.path / rd.METRICS).read_text().splitlines()) == 1  # the new run's step
    assert not fake_controller.seen["previous"].exists()


def test_a_resumed_run_keeps_the_checkpoints_in_place_whatever_happens(tmp_path, fake_controller):
    run = _previous_run(tmp_path)
    ckpt = _tree_hash(run.checkpoints)
    cfg = _cfg(tmp_path, run)
    cfg.actor_config.load = str(run.checkpoints / "final")
    fake_controller.fail = UserError("no")
    before = _tree_hash(tmp_path)
    with pytest.raises(UserError):
        train(cfg, "cpu")
    assert _tree_hash(tmp_path) == before
    fake_controller.fail, fake_controller.steps = None, 1
    train(cfg, "cpu")
    assert _tree_hash(run.checkpoints) == ckpt


def test_create_that_cannot_set_aside_changes_nothing(tmp_path, monkeypatch):
    run = _previous_run(tmp_path)
    before = _tree_hash(tmp_path)
    real_rename = os.rename
    calls = []

    def rename(a, b):
        calls.append(a)
        if len(calls) == 3:
            raise OSError(5, "Input/output error")
        real_rename(a, b)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(UserError, match="Input/output error"):
        rd.RunDir.create(run.path, "new: 1\n", overwrite=True)
    monkeypatch.setattr(os, "rename", real_rename)
    assert _tree_hash(tmp_path) == before


def test_a_resumed_run_continues_its_streamed_files_up_to_the_checkpoint(tmp_path) -> None:
    """Resuming its own checkpoint of step 2, a run keeps the samples of steps 0-1, the metrics of steps
    <= 2 and the whole run log (a killed run's torn last line dropped), and appends after them."""
    run_path = tmp_path / "run"
    run_path.mkdir()
    samples = [{"prompt_id": f"p{i}", "trainer_step": i} for i in range(4)]
    torn = '\n{"prompt_id": "p4", "tr'  # the killed run's last line
    (run_path / rd.SAMPLES).write_text("\n".join(json.dumps(r) for r in samples) + torn)
    metrics = [{"step": s} for s in (1, 2, 3)] + [{"step": 3, "final": 1}]
    (run_path / rd.METRICS).write_text("".join(json.dumps(r) + "\n" for r in metrics))
    (run_path / rd.RUN_LOG).write_text('{"event": "stopped"}\n')
    (run_path / rd.CHECKPOINTS).mkdir()
    run = rd.RunDir.create(run_path, "x: 1\n", keep_checkpoints=True, continue_streams=True)
    run.continue_from(2)
    assert run.continuing
    kept = [json.loads(ln) for ln in (run_path / rd.SAMPLES).read_text().splitlines()]
    assert [r["trainer_step"] for r in kept] == [0, 1]
    metrics_kept = [json.loads(ln) for ln in (run_path / rd.METRICS).read_text().splitlines()]
    assert metrics_kept == [{"step": 1}, {"step": 2}]
    assert (run_path / rd.RUN_LOG).read_text() == '{"event": "stopped"}\n'
    run.commit()
    assert not list(run_path.glob(f"{rd.PREVIOUS}.*")) or all(
        not (p / rd.SAMPLES).exists() for p in run_path.glob(f"{rd.PREVIOUS}.*"))
