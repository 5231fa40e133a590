"""The one-page run report (PNG): reward curve, throughput, queue occupancy, lag histogram, bubbles.

With validation (`trainer.test_freq`), the reward panel also draws each data source's held-out reward
(`val/reward/<source>`, dashed) and `validation_lines` gives the per-source table `asp-npu report`
prints (reward and accuracy at each validated step).

Drawn only from files in the run directory (metrics.jsonl, queue.jsonl, samples.jsonl,
summary.json), so `asp-npu report RUN_DIR` redraws it after the run, on any machine.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from asp_npu.core import run_dir as rd
from asp_npu.errors import UserError
from asp_npu.io import atomic_write_with
from asp_npu.observe.metrics import (
    E2E_TPS,
    LAG_MAX,
    LAG_MEAN,
    QUEUE_OCCUPANCY,
    RESPONSE_LEN_MEAN,
    REWARD_MEAN,
    TIMING_ITERATION,
    VLLM_TPS,
    read_metrics,
)

BUBBLE_KINDS = ("utilization", "padding", "skewness", "sorting")


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool):
            xs.append(float(r["step"]))
            ys.append(float(v))
    return xs, ys


def _bubbles(summary: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, float]:
    if isinstance(summary.get("bubbles"), dict):
        return {k: float(v) for k, v in summary["bubbles"].items() if isinstance(v, int | float)}
    last = rows[-1] if rows else {}
    return {k[len("bubbles/"):]: float(v) for k, v in last.items() if k.startswith("bubbles/")}


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _checked(rows: list[Any], path: Path, keys: tuple[str, ...],
             optional: bool = False) -> list[dict[str, Any]]:
    """`rows` of a run file, each an object whose `keys` are numbers (`optional`: or all absent)."""
    for n, r in enumerate(rows, 1):
        if not isinstance(r, dict):
            raise UserError(f"{path}: row {n} is not a JSON object")
        if optional and not any(k in r for k in keys):
            continue
        bad = [k for k in keys if not _number(r.get(k))]
        if bad:
            raise UserError(f"{path}: row {n}: '{bad[0]}' is missing or not a number")
    return rows


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    try:
        rows = read_metrics(path)
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    return _checked(rows, path, ("step",))


def token_lags(samples: list[dict[str, Any]]) -> Counter[int]:
    """Consumed tokens by lag, from each sample's recorded version change points (empty if none)."""
    out: Counter[int] = Counter()
    for s in samples:
        ch = s.get("version_changes")
        if not ch or "step" not in s:
            continue
        n = int(s.get("response_len", 0))
        for k, (lo, v) in enumerate(ch):
            hi = ch[k + 1][0] if k + 1 < len(ch) else n
            out[int(s["step"]) - int(v)] += max(0, int(hi) - int(lo))
    return out


VAL_REWARD, VAL_ACC = "val/reward/", "val/acc/"


def validation_sources(rows: list[dict[str, Any]]) -> list[str]:
    """Data sources with a validation reward in the metrics (`all` last)."""
    names = {k[len(VAL_REWARD):] for r in rows for k in r if k.startswith(VAL_REWARD)}
    return sorted(names - {"all"}) + (["all"] if "all" in names else [])


def validation_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per validated step and data source: `step 3  gsm8k  reward 0.412  acc 0.375`."""
    out = []
    for r in rows:
        for name in validation_sources([r]):
            acc = r.get(VAL_ACC + name)
            line = f"step {int(r['step'])}  {name}  reward {float(r[VAL_REWARD + name]):.3f}"
            out.append(line + (f"  acc {float(acc):.3f}" if isinstance(acc, int | float) else ""))
    return out


def _reward_panel(ax: Any, rows: list[dict]) -> None:
    xs, ys = _series(rows, REWARD_MEAN)
    ax.plot(xs, ys, marker="o", ms=3, label="training")
    for name in validation_sources(rows):
        vx, vy = _series(rows, VAL_REWARD + name)
        ax.plot(vx, vy, ls="--", marker="s", ms=4, label=f"validation: {name}")
    ax.set(title="reward (mean per trainer step)", xlabel="trainer step", ylabel="reward")
    if validation_sources(rows):
        ax.legend(fontsize=8)


def _throughput_panel(ax: Any, rows: list[dict], summary: dict) -> None:
    for key, label in ((E2E_TPS, "end-to-end (consumed tokens/s)"), (VLLM_TPS, "generated, per instance")):
        xs, ys = _series(rows, key)
        if ys:
            ax.plot(xs, ys, marker="o", ms=3, label=label)
    if "throughput_tokens_per_s" in summary:
        ax.axhline(summary["throughput_tokens_per_s"], ls="--", c="gray", label="run mean (e2e)")
    ax.set(title="throughput", xlabel="trainer step", ylabel="tokens / s")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _queue_panel(ax: Any, queue: list[dict], rows: list[dict]) -> None:
    if queue:
        t0 = queue[0]["t"]
        ax.step([q["t"] - t0 for q in queue], [q["occupancy"] for q in queue], where="post")
        ax.set(xlabel="seconds since start")
    else:
        xs, ys = _series(rows, QUEUE_OCCUPANCY)
        ax.plot(xs, ys, marker="o", ms=3)
        ax.set(xlabel="trainer step")
    ax.set(title="TrainQueue occupancy", ylabel="samples waiting")


def _lag_panel(ax: Any, rows: list[dict], samples: list[dict], summary: dict) -> None:
    """Samples by lag (oldest token) beside tokens by lag when every token's version is recorded."""
    lags = Counter(int(s["step"]) - int(s["policy_version"]) for s in samples if "step" in s)
    tokens = token_lags(samples)
    if lags and tokens:  # every token's version recorded: samples (oldest token) and tokens, as shares
        keys = sorted(set(lags) | set(tokens))
        n_s, n_t = sum(lags.values()), sum(tokens.values()) or 1
        xs_ = np.arange(len(keys))
        ax.bar(xs_ - 0.2, [lags[k] / n_s for k in keys], 0.4, label="samples (oldest token)")
        ax.bar(xs_ + 0.2, [tokens[k] / n_t for k in keys], 0.4, label="tokens")
        ax.set_xticks(xs_, [str(k) for k in keys])
        ax.legend(fontsize=8)
    elif lags:
        keys = sorted(lags)
        ax.bar([str(k) for k in keys], [lags[k] for k in keys])
    else:
        xs, ys = _series(rows, LAG_MEAN)
        ax.plot(xs, ys, label="mean")
        xs, ys = _series(rows, LAG_MAX)
        ax.plot(xs, ys, label="max")
        if ys:
            ax.legend(fontsize=8)
    bound = summary.get("max_lag")
    if tokens and summary.get("partial_rollout"):
        ax.set(title=f"lag: group newest <= {bound}, every token <= {summary.get('max_token_lag')}",
               xlabel="lag (versions)", ylabel="share")
    else:
        ax.set(title=f"policy lag of trained samples (bound {bound})", xlabel="lag (versions)",
               ylabel="share" if tokens else "samples")


def _bubble_panel(ax: Any, summary: dict, rows: list[dict]) -> None:
    bubbles = _bubbles(summary, rows)
    names = [k for k in BUBBLE_KINDS if k in bubbles] + sorted(set(bubbles) - set(BUBBLE_KINDS))
    if names:
        ax.barh(names, [bubbles[n] for n in names], color=["tab:green"] + ["tab:red"] * (len(names) - 1))
        for i, n in enumerate(names):
            ax.text(bubbles[n], i, f" {bubbles[n]:.1%}", va="center", fontsize=8)
        ax.set_xlim(0, 1.15)
    ax.set(title="device-time breakdown (bubble accounting)", xlabel="share of device-seconds")


def _iteration_panel(ax: Any, rows: list[dict]) -> None:
    xs, ys = _series(rows, TIMING_ITERATION)
    ax.plot(xs, ys, marker="o", ms=3, label="iteration time (s)")
    ax.set(title="iteration time and response length", xlabel="trainer step", ylabel="seconds")
    xs, ys = _series(rows, RESPONSE_LEN_MEAN)
    if ys:
        ax2 = ax.twinx()
        ax2.plot(xs, ys, c="tab:orange", marker="s", ms=3, label="response length (mean)")
        ax2.set_ylabel("tokens")
        ax2.legend(fontsize=8, loc="upper right")
    ax.legend(fontsize=8, loc="upper left")


def limit_text(summary: dict[str, Any]) -> str:
    """`, 1.42x its limit, MFU 3.1%` from a run summary's `against_limit` (empty where not measured)."""
    lim = summary.get("against_limit") or {}
    x, m = lim.get("x_limit"), lim.get("mfu")
    parts = ([f"{x:.2f}x its limit"] if _number(x) else []) + ([f"MFU {m:.1%}"] if _number(m) else [])
    return ", " + ", ".join(parts) if parts else ""


def draw_report(run_path: str | Path, out: str | Path | None = None) -> Path:
    """Draw `report.png` (or `out`) for the run directory at `run_path`; returns the written path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = rd.RunDir.open(run_path)
    rows = _read_metrics(run / rd.METRICS)
    queue = _checked(run.read_jsonl(rd.QUEUE), run / rd.QUEUE, ("t", "occupancy"))
    samples = _checked(run.read_jsonl(rd.SAMPLES), run / rd.SAMPLES, ("step", "policy_version"),
                       optional=True)
    summary = run.read_summary()
    for key in ("throughput_tokens_per_s",):
        if key in summary and not _number(summary[key]):
            raise UserError(f"{run / rd.SUMMARY}: '{key}' is not a number")
    title = f"{run.path.name}: mode {summary.get('mode', '?')}, max_lag {summary.get('max_lag', '?')}"
    title += limit_text(summary)

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    fig.suptitle(title)
    _reward_panel(axes[0][0], rows)
    _throughput_panel(axes[0][1], rows, summary)
    _queue_panel(axes[0][2], queue, rows)
    _lag_panel(axes[1][0], rows, samples, summary)
    _bubble_panel(axes[1][1], summary, rows)
    _iteration_panel(axes[1][2], rows)
    fig.tight_layout()
    target = Path(out) if out is not None else run / rd.REPORT
    try:  # temp + fsync + rename: a failed write leaves neither a torn report nor the temp file
        atomic_write_with(target, lambda f: fig.savefig(f, format="png", dpi=90))
    finally:
        plt.close(fig)
    return target
