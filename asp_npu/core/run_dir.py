"""The run directory: everything one training run leaves behind, in one documented layout.

    config.yaml        the resolved config (defaults + file + overrides) the run used
    derived.yaml       what the run derived at its (latest) start: the policy it started from, the
                       checkpoint it resumed from, the trainer ranks' cores (`pipeline/derived.py`)
    metrics.jsonl      one row per trainer step (asp_npu.observe.metrics names)
    tensorboard/       the same metrics as TensorBoard events
    samples.jsonl      the consumption ledger: one row per trained sample (prompt_id, sample_idx,
                       policy_version, step, instance, response_len, reward) - lag = step - version
    queue.jsonl        TrainQueue occupancy over time (t, occupancy, admitted, consumed, version)
    events.json        the event log the bubble accounting reads (asp-events/1 JSON: instances, queue,
                       trainer; `asp_npu.observe.events.EventLog.read`)
    plans/             the RolloutPlan of each planning window (asp-plan/1 JSON)
    timeline.json      Perfetto / Chrome trace of instances, queue and trainer
    summary.json       run totals (throughput, iteration time, lag, bubbles, planned vs done)
    run_log.jsonl      failures, retries, restarts and recoveries, one JSON line each, as they happen
    checkpoints/       trainer checkpoints
    report.png         the one-page report (`asp-npu report RUN_DIR` redraws it)
    warm_start/        the SFT warm-started HF model the run started from (model.warm_start_steps > 0)
    logs/              each actor's own log (instances, trainer ranks)
    .asp-npu-run       the marker: other commands never write their outputs into a run's files

Only these names are ever touched when a run directory is reused, so a user's own files survive. A new
run starts only once it has passed validation, and even then the previous run's files are not deleted:
`create` moves them aside into `previous-run.XXXXXX/`; `commit` deletes them once the new run has
trained, `rollback` puts them back (byte-identical) when the new run fails before its first trainer
step. A previous run's checkpoints are never replaced unless the user asks (`--overwrite`), see
`reuse_problem`. A run killed outright leaves its `previous-run.*` folder for the user to inspect.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from asp_npu.errors import UserError
from asp_npu.io import atomic_write, atomic_write_json, atomic_write_lines

CONFIG = "config.yaml"
DERIVED = "derived.yaml"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
SAMPLES = "samples.jsonl"
QUEUE = "queue.jsonl"
EVENTS = "events.json"
PLANS = "plans"
TIMELINE = "timeline.json"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
REPORT = "report.png"
WARM_START = "warm_start"
RUN_LOG = "run_log.jsonl"
LOGS = "logs"  # each actor's own log (asp_npu.observe.actor_log)
MARKER = ".asp-npu-run"  # marks the folder as a run's: no other command's output is written into it
OWNED = (CONFIG, DERIVED, METRICS, TENSORBOARD, SAMPLES, QUEUE, EVENTS, PLANS, TIMELINE, SUMMARY, CHECKPOINTS,
         REPORT, WARM_START, RUN_LOG, LOGS, MARKER)
STREAMED = (SAMPLES, METRICS, RUN_LOG, LOGS)  # appended as the run goes: a resumed run continues them
PREVIOUS = "previous-run"  # prefix of the folder a replaced run's files wait in until the new run trained


class RunDir:
    """Paths and writers of one run directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.previous: Path | None = None  # where the replaced run's files wait (create .. commit)
        self._kept: tuple[str, ...] = ()  # names create left in place (checkpoints a run resumes from)
        self._made = False  # create made the folder itself
        self.continuing = False  # a resumed run appends to the streamed files (`continue_from`)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @staticmethod
    def reuse_problem(path: str | Path, overwrite: bool = False,
                      keep_checkpoints: bool = False) -> str | None:
        """Why a new run may not start in `path` (None = it may): it is not a folder, or it holds a
        previous run's checkpoints that the new run would delete. Touches nothing."""
        p = Path(path)
        if p.exists() and not p.is_dir():
            return f"trainer.run_dir: {p} exists and is not a folder"
        above = next((a for a in p.parents if a.exists()), None)
        if above is not None and not above.is_dir():
            return f"trainer.run_dir: {p} cannot be made ({above} is not a folder)"
        ckpt = p / CHECKPOINTS
        if not overwrite and not keep_checkpoints and ckpt.is_dir() and any(ckpt.iterdir()):
            return (f"trainer.run_dir: {p} holds a previous run's checkpoints; pass --overwrite to replace "
                    "that run, or set a new trainer.run_dir")
        return None

    @classmethod
    def create(cls, path: str | Path, config_yaml: str, keep_checkpoints: bool = False,
               overwrite: bool = False, continue_streams: bool = False) -> RunDir:
        """Make (or reuse) the folder, set aside what a previous run left in our layout, snapshot the config.

        Call it only once the new run has passed validation. A previous run's checkpoints are refused
        (`reuse_problem`) unless `overwrite`, or kept in place (`keep_checkpoints`: a run resuming from
        them); the rest is moved into `self.previous` until `commit` or `rollback`."""
        run = cls(path)
        problem = cls.reuse_problem(run.path, overwrite, keep_checkpoints)
        if problem:
            raise UserError(problem)
        run._made = not run.path.exists()
        run._kept = ((CHECKPOINTS,) if keep_checkpoints else ()) + (STREAMED if continue_streams else ())
        try:
            run.path.mkdir(parents=True, exist_ok=True)
            run._set_aside()
        except OSError as exc:
            raise UserError(f"trainer.run_dir: cannot prepare {run.path} ({exc.strerror})") from None
        try:  # from here on everything in our layout is the new run's: rollback may remove it
            (run.path / PLANS).mkdir()
            (run.path / CHECKPOINTS).mkdir(exist_ok=True)
            atomic_write(run.path / CONFIG, config_yaml)
            atomic_write(run.path / MARKER, "asp-npu run directory\n")
        except (OSError, UserError) as exc:
            run.rollback()
            why = exc.strerror if isinstance(exc, OSError) else str(exc)
            raise UserError(f"trainer.run_dir: cannot prepare {run.path} ({why})") from None
        return run

    def _set_aside(self) -> None:
        """Move the previous run's files into `self.previous`, all or none (a failure moves them back)."""
        present = [n for n in OWNED if n not in self._kept and os.path.lexists(self.path / n)]
        if not present:
            return
        aside = Path(tempfile.mkdtemp(prefix=f"{PREVIOUS}.", dir=self.path))
        moved: list[str] = []
        try:
            for name in present:
                os.rename(self.path / name, aside / name)
                moved.append(name)
        except BaseException:
            for name in moved:
                os.rename(aside / name, self.path / name)
            aside.rmdir()
            raise
        self.previous = aside

    def continue_from(self, step: int) -> None:
        """A run resuming its own checkpoint of trainer step `step`: keep the streamed rows up to it
        (samples consumed by earlier steps, metrics of steps <= `step`, every run_log event) and append
        to them; rows of later steps are trained again, so they go. A torn last line (a killed run) is
        dropped; the files are rewritten temp + fsync + rename."""
        def keep_sample(r: dict[str, Any]) -> bool:
            return int(r.get("trainer_step", 0)) < step

        def keep_metric(r: dict[str, Any]) -> bool:
            return "final" not in r and int(r.get("step", 0)) <= step

        for name, ok in ((SAMPLES, keep_sample), (METRICS, keep_metric)):
            target = self.path / name
            if not target.is_file():
                continue
            rows = []
            for line in _read_text(target).splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a torn line of the killed run
                if isinstance(row, dict) and ok(row):
                    rows.append(json.dumps(row))
            atomic_write_lines(target, rows)
        self.continuing = True

    def trained(self) -> bool:
        """Whether the new run has trained at least one step (its consumption ledger has a row)."""
        try:
            return (self.path / SAMPLES).stat().st_size > 0
        except OSError:
            return False

    def commit(self) -> None:
        """The new run stands: delete the previous run's files set aside by `create`."""
        if self.previous is not None:
            shutil.rmtree(self.previous, ignore_errors=True)
            self.previous = None

    def rollback(self) -> None:
        """The new run failed before training: remove what it wrote in our layout and put the previous
        run's files back as they were (a folder `create` made is removed again)."""
        for name in OWNED:
            target = self.path / name
            if name in self._kept or not os.path.lexists(target):
                continue
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
        if self.previous is not None:
            for entry in self.previous.iterdir():
                os.rename(entry, self.path / entry.name)
            self.previous.rmdir()
            self.previous = None
        if self._made:
            try:
                self.path.rmdir()  # only if empty: nothing of the user's is ever removed
            except OSError:
                pass

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        """An existing run directory (for `asp-npu report`): it must at least hold metrics.jsonl."""
        run = cls(path)
        if not run.path.is_dir():
            raise UserError(f"{run.path}: no such run directory")
        if not (run.path / METRICS).is_file():
            raise UserError(f"{run.path}: not a run directory (no {METRICS})")
        return run

    def write_jsonl(self, name: str, rows: list[dict[str, Any]]) -> Path:
        return atomic_write_lines(self.path / name, [json.dumps(r) for r in rows])

    def read_jsonl(self, name: str) -> list[dict[str, Any]]:
        """The rows of a JSONL run file ([] when absent); a torn or mistyped file is a UserError naming
        the file and line."""
        p = self.path / name
        if not p.is_file():
            return []
        rows: list[dict[str, Any]] = []
        for n, line in enumerate(_read_text(p).splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise UserError(f"{p}:{n}: not a JSON line ({exc.args[0].split(':')[0]})") from None
            if not isinstance(row, dict):
                raise UserError(f"{p}:{n}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
        return rows

    def write_summary(self, summary: dict[str, Any]) -> Path:
        return atomic_write_json(self.path / SUMMARY, summary, indent=2)

    def read_summary(self) -> dict[str, Any]:
        """summary.json ({} when absent); a torn or mistyped file is a UserError naming it."""
        p = self.path / SUMMARY
        if not p.is_file():
            return {}
        try:
            summary = json.loads(_read_text(p))
        except ValueError as exc:
            raise UserError(f"{p}: not valid JSON ({exc.args[0].split(':')[0]})") from None
        if not isinstance(summary, dict):
            raise UserError(f"{p}: expected a JSON object, got {type(summary).__name__}")
        return summary

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def plans(self) -> Path:
        return self.path / PLANS


def _read_text(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{p}: not UTF-8 text") from None
    except OSError as exc:
        raise UserError(f"{p}: cannot read ({exc.strerror})") from None
