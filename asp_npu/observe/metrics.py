"""Per-step training metrics: one console progress line, a JSONL file, TensorBoard events, wandb, swanlab.

Metric names follow MindSpeed-RL / verl so dashboards users already have keep working
(`timing/rollout`, `timing/update`, `e2e_tps`, `vllm_tps`, `response_length/mean`,
`trainer/idle_ratio`, `rollouter/idle_ratio`) plus the asynchronous pipeline's own
(`async/lag_mean`, `async/lag_max`, `queue/occupancy`, `bubbles/*`, `reward/mean`).
TensorBoard events are written with tensorboard's own event writer, so logging never imports torch.
wandb and swanlab (`trainer.logger`, as verl names them) log under `trainer.project_name` /
`experiment_name` into the run directory; with no API key in the environment and no mode set they run
offline (`WANDB_MODE=offline`, swanlab `mode="offline"`), so a run never needs the network: sync later
with `wandb sync` / `swanlab sync`. `WANDB_MODE` / `SWANLAB_MODE` set by the user win.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Literal, TextIO

from asp_npu.io import close_synced

# the names the pipeline writes every step (others, e.g. `actor/*` from the trainer, pass through)
TIMING_ROLLOUT = "timing/rollout"  # seconds the trainer waited for this step's minibatch
TIMING_UPDATE = "timing/update"  # seconds of the trainer step itself
TIMING_REFRESH = "timing/weight_refresh"  # seconds of weight refresh on the critical path
TIMING_ITERATION = "timing/iteration"  # wall seconds between the ends of consecutive trainer steps
E2E_TPS = "e2e_tps"  # generated tokens consumed by this step / timing/iteration (whole system)
VLLM_TPS = "vllm_tps"  # tokens generated in the step's window / its seconds / instances (per instance)
RESPONSE_LEN_MEAN = "response_length/mean"
RESPONSE_LEN_MAX = "response_length/max"
RESPONSE_LEN_MIN = "response_length/min"
REWARD_MEAN = "reward/mean"
LAG_MEAN = "async/lag_mean"
LAG_MAX = "async/lag_max"
LAG_NEWEST_MAX = "async/lag_newest_max"  # partial rollout: lag of the groups' newest tokens (<= max_lag)
TOKEN_LAG_MEAN = "rollout/token_lag_mean"  # every consumed token: trainer step - its behaviour version
TOKEN_LAG_MAX = "rollout/token_lag_max"
TOKEN_LAG_HIST = "rollout/token_lag_hist"  # {lag: tokens} of this step (a TensorBoard histogram)
BASELINE_TOKENS = "rollout/baseline_tokens"  # remax: tokens of the step's groups' greedy baseline responses
QUEUE_OCCUPANCY = "queue/occupancy"  # samples waiting in the TrainQueue when the step took its batch
TRAINER_IDLE = "trainer/idle_ratio"
ROLLOUTER_IDLE = "rollouter/idle_ratio"
BUBBLES_PREFIX = "bubbles/"
X_LIMIT = "perf/x_limit"  # the run's mean iteration time over its bound (asp_npu/pipeline/efficiency.py)
MFU = "perf/mfu"  # trainer model FLOP/s per device over one device's measured matmul FLOP/s

CONSOLE_KEYS = (REWARD_MEAN, E2E_TPS, LAG_MEAN, LAG_MAX, QUEUE_OCCUPANCY)


def _finite(value: Any) -> float | None:
    """Scalars only; bools, strings, NaN and inf are not plotted (JSONL keeps what JSON can hold)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


class _TensorBoard:
    """Scalar summaries through tensorboard's EventFileWriter (no torch, no TF)."""

    def __init__(self, folder: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        folder.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(folder))

    def add(self, step: int, metrics: dict[str, float], wall_time: float) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in metrics.items()]
        if values:
            self._writer.add_event(
                event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=values))
            )

    def add_histogram(self, step: int, tag: str, counts: dict[int, int], wall_time: float) -> None:
        """An integer histogram {value: count} (one bucket per integer)."""
        from tensorboard.compat.proto import event_pb2, summary_pb2

        if not counts:
            return
        lo, hi = min(counts), max(counts)
        n = sum(counts.values())
        total = sum(k * c for k, c in counts.items())
        hist = summary_pb2.HistogramProto(
            min=float(lo), max=float(hi), num=float(n), sum=float(total),
            sum_squares=float(sum(k * k * c for k, c in counts.items())),
            bucket_limit=[lo - 0.5] + [k + 0.5 for k in range(lo, hi + 1)],
            bucket=[0.0] + [float(counts.get(k, 0)) for k in range(lo, hi + 1)])
        value = summary_pb2.Summary.Value(tag=tag, histo=hist)
        self._writer.add_event(event_pb2.Event(wall_time=wall_time, step=step,
                                               summary=summary_pb2.Summary(value=[value])))

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()


LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "swanlab")


def _mode(env: str, key_env: str) -> str | None:
    """The user's mode, else offline when no API key is configured (never reach for the network)."""
    if os.environ.get(env):
        return os.environ[env]
    return None if os.environ.get(key_env) else "offline"


class _WandB:
    """Scalars to a wandb run (offline unless configured otherwise)."""

    def __init__(self, folder: Path, project: str, name: str, config: dict[str, Any] | None) -> None:
        import wandb

        folder.mkdir(parents=True, exist_ok=True)
        mode = _mode("WANDB_MODE", "WANDB_API_KEY")
        self._run = wandb.init(project=project, name=name, dir=str(folder), config=config or {},
                               mode=mode, reinit="create_new")  # type: ignore[arg-type]

    def add(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        self._run.finish()


class _SwanLab:
    """Scalars to a swanlab experiment (offline unless configured otherwise)."""

    def __init__(self, folder: Path, project: str, name: str, config: dict[str, Any] | None) -> None:
        import swanlab  # type: ignore[import-untyped]

        folder.mkdir(parents=True, exist_ok=True)
        self._lab = swanlab
        self._run = swanlab.init(project=project, experiment_name=name, logdir=str(folder),
                                 mode=_mode("SWANLAB_MODE", "SWANLAB_API_KEY"), config=config or {})

    def add(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        self._lab.finish()


def progress_line(step: int, total: int, metrics: dict[str, Any], max_lag: int | None = None) -> str:
    """`[####......] step 3/10 | reward 0.412 | 1,234 tok/s | lag 0.50 (max 1/1) | queue 16 | 12.3s`."""
    width = 20
    done = min(width, round(width * step / total)) if total > 0 else 0
    parts = [f"[{'#' * done}{'.' * (width - done)}] step {step}/{total}" if total > 0 else f"step {step}"]
    if (r := _finite(metrics.get(REWARD_MEAN))) is not None:
        parts.append(f"reward {r:.3f}")
    if (tps := _finite(metrics.get(E2E_TPS))) is not None:
        parts.append(f"{tps:,.0f} tok/s")
    lag_mean, lag_max = _finite(metrics.get(LAG_MEAN)), _finite(metrics.get(LAG_MAX))
    if lag_mean is not None and lag_max is not None:
        bound = f"/{max_lag}" if max_lag is not None else ""
        parts.append(f"lag {lag_mean:.2f} (max {lag_max:.0f}{bound})")
    if (q := _finite(metrics.get(QUEUE_OCCUPANCY))) is not None:
        parts.append(f"queue {q:.0f}")
    if (it := _finite(metrics.get(TIMING_ITERATION))) is not None:
        parts.append(f"{it:.1f}s")
    return " | ".join(parts)


class MetricsLogger:
    """Write each step's metrics to the configured sinks: `console`, `jsonl`, `tensorboard`, `wandb`,
    `swanlab` (`project` / `experiment` name the last two's run; `config` is recorded with it).

    `log` is called once per trainer step; JSONL lines are flushed at once so a crashed run still
    has its curve, and `asp-npu report` can redraw from `metrics.jsonl` alone.
    """

    def __init__(
        self,
        run_dir: str | Path | None,
        loggers: list[str] | tuple[str, ...] = ("console", "jsonl", "tensorboard"),
        total_steps: int = 0,
        max_lag: int | None = None,
        stream: TextIO | None = None,
        prefix: str = "",
        append: bool = False,
        project: str = "asp-npu",
        experiment: str = "",
        config: dict[str, Any] | None = None,
    ) -> None:
        unknown = sorted(set(loggers) - set(LOGGERS))
        if unknown:
            raise ValueError(f"unknown logger(s) {unknown}; use {', '.join(LOGGERS)}")
        self.total_steps = total_steps
        self.max_lag = max_lag
        self.prefix = prefix
        self._stream = stream if stream is not None else sys.stderr
        self._console = "console" in loggers
        self._jsonl: TextIO | None = None
        self._tb: _TensorBoard | None = None
        self._remote: list[_WandB | _SwanLab] = []
        self.history: list[dict[str, Any]] = []
        if run_dir is not None:
            folder = Path(run_dir)
            folder.mkdir(parents=True, exist_ok=True)
            if "jsonl" in loggers:
                path = folder / "metrics.jsonl"  # append: a resumed run continues its metrics
                mode: Literal["a", "w"] = "a" if append else "w"
                self._jsonl = open(path, mode, encoding="utf-8")  # noqa: SIM115
            if "tensorboard" in loggers:
                self._tb = _TensorBoard(folder / "tensorboard")
            name = experiment or folder.resolve().name
            if "wandb" in loggers:
                self._remote.append(_WandB(folder, project, name, config))
            if "swanlab" in loggers:
                self._remote.append(_SwanLab(folder / "swanlog", project, name, config))

    def log(self, step: int, metrics: dict[str, Any], console: bool = True) -> None:
        """One row to every sink; `console=False` keeps a summary row off the progress line."""
        now = time.time()
        row = {"step": step, "time": now, **metrics}
        self.history.append(row)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(row, default=float, allow_nan=True) + "\n")
            self._jsonl.flush()
        scalars = {k: v for k, v in ((k, _finite(v)) for k, v in metrics.items()) if v is not None}
        for sink in self._remote:
            sink.add(step, scalars)
        if self._tb is not None:
            self._tb.add(step, scalars, now)
            for k, v in metrics.items():
                if isinstance(v, dict) and v and all(_finite(c) is not None for c in v.values()):
                    self._tb.add_histogram(step, k, {int(x): int(c) for x, c in v.items()}, now)
        if self._console and console:
            line = progress_line(step, self.total_steps, metrics, self.max_lag)
            print(f"{self.prefix}{line}", file=self._stream, flush=True)

    def close(self) -> None:
        if self._jsonl is not None:
            close_synced(self._jsonl)
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        for sink in self._remote:
            sink.close()
        self._remote = []

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a `metrics.jsonl` (a torn last line from a crashed run is skipped)."""
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows
