"""Predictor quality on one epoch of a trace, using only earlier epochs (the oracle may read it)."""

from __future__ import annotations

from typing import Any

import numpy as np

from asp_npu.data.traces import Trace
from asp_npu.predict.base import Estimates, Predictor
from asp_npu.predict.factory import make_predictor
from asp_npu.predict.oracle import OraclePredictor


def fitted_predictor(trace: Trace, epoch: int, name: str) -> Predictor:
    """A predictor that has observed every sample of epochs < `epoch` (and, for the oracle, `epoch`)."""
    pred = make_predictor(name)
    hist = trace.before(epoch)
    if len(hist):
        pred.observe_many(hist.prompt_names[hist.prompt_code], hist.epoch, hist.response_len, hist.prompt_len)
    if isinstance(pred, OraclePredictor):
        cur = trace.epoch_rows(epoch)
        pred.reveal(cur.prompt_names[cur.prompt_code], cur.response_len)
    return pred


def predict_epoch(trace: Trace, epoch: int, name: str) -> tuple[Trace, np.ndarray, Estimates]:
    """(rows of `epoch`, per-row index into the estimates, per-prompt estimates)."""
    cur = trace.epoch_rows(epoch)
    codes, row_pos = np.unique(cur.prompt_code, return_inverse=True)
    first = np.zeros(codes.size, dtype=np.int64)
    first[row_pos[::-1]] = np.arange(len(cur))[::-1]  # first row of each prompt
    est = fitted_predictor(trace, epoch, name).predict_many(trace.prompt_names[codes], cur.prompt_len[first])
    return cur, row_pos, est


def _spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """None (JSON null) when undefined: fewer than two values or a constant side."""
    if a.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    from scipy.stats import spearmanr  # lazy: `asp-npu plan` imports this module but never ranks

    return round(float(spearmanr(a, b).statistic), 4)


def evaluate(trace: Trace, epoch: int, name: str) -> dict[str, Any]:
    """`spearman`: rank correlation of predicted vs actual *group mean* (what the planner sorts by);
    `spearman_samples`: the same per sample; `mae`: mean |predicted mean - actual| per sample;
    `coverage_q90`: share of samples at or below the predicted q90 (ideal 0.9)."""
    cur, row_pos, est = predict_epoch(trace, epoch, name)
    actual = cur.response_len.astype(np.float64)
    n_prompts = len(est)
    group_mean = np.bincount(row_pos, weights=actual, minlength=n_prompts) / np.bincount(
        row_pos, minlength=n_prompts
    )
    pm = est.mean[row_pos]
    return {
        "predictor": name,
        "epoch": int(epoch),
        "samples": int(actual.size),
        "prompts": n_prompts,
        "spearman": _spearman(est.mean, group_mean),
        "spearman_samples": _spearman(pm, actual),
        "mae": round(float(np.mean(np.abs(pm - actual))), 1),
        "mape_group": round(float(np.mean(np.abs(est.mean - group_mean) / group_mean)), 4),
        "coverage_q90": round(float(np.mean(actual <= est.q90[row_pos])), 4),
        "from_history": round(float(np.mean(est.source == "history")), 4),
    }
