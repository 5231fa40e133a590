"""History predictor: per prompt, recency-weighted robust statistics of its earlier epochs' samples.

Same-prompt responses have similar lengths across epochs (RhymeRL, Seer; ANCHORS.md), so a prompt's
own past is the best signal. Each past epoch counts `decay**age` (age 0 = the prompt's latest epoch)
so that per-prompt change is followed, and an optional population drift factor (median over prompts
of the log-change between the two latest epochs, clipped) extrapolates a global length trend, as
reasoning lengths grow during RL. Prompts never seen go to the cold-start `PromptLenPredictor`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from asp_npu.predict.base import Estimates, ObservationLog, grouped_quantiles
from asp_npu.predict.coldstart import PromptLenPredictor
from asp_npu.types import LengthEstimate

_Z90 = 1.2815515655446004


class HistoryPredictor:
    name = "history"

    def __init__(self, decay: float = 0.6, drift_correction: bool = True, max_drift: float = 0.3) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1] (got {decay})")
        self.decay = decay
        self.drift_correction = drift_correction
        self.max_drift = max_drift
        self.log = ObservationLog()
        self.cold = PromptLenPredictor()
        self._fit_version = -1
        self._index: dict[str, int] = {}
        self._names = np.array([], dtype=str)
        self._stats = (np.array([]), np.array([]), np.array([]))
        self.drift = 0.0  # fitted log-change per epoch
        self.epoch_sd = 0.0  # fitted sd of a prompt's log-length shift from one epoch to the next

    def observe(self, prompt_id: str, epoch: int, response_len: int, prompt_len: int | None = None) -> None:
        self.log.add(prompt_id, epoch, response_len, prompt_len)
        self.cold.observe(prompt_id, epoch, response_len, prompt_len)

    def observe_many(
        self,
        prompt_ids: ArrayLike,
        epochs: ArrayLike,
        response_lens: ArrayLike,
        prompt_lens: ArrayLike | None = None,
    ) -> None:
        self.log.add_many(prompt_ids, epochs, response_lens, prompt_lens)
        self.cold.observe_many(prompt_ids, epochs, response_lens, prompt_lens)

    def state_dict(self) -> dict[str, object]:
        """What a checkpoint carries: the observations (every fitted statistic is recomputed from them,
        so a restored predictor predicts exactly what this one does)."""
        return {"name": self.name, "log": self.log.state_dict(), "cold": self.cold.state_dict()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.log.load_state_dict(state["log"])  # type: ignore[arg-type]
        self.cold.load_state_dict(state["cold"])  # type: ignore[arg-type]

    def _fit(self) -> None:
        if self._fit_version == self.log.version:
            return
        self._fit_version = self.log.version
        ids, ep, ln, _ = self.log.arrays()
        names, codes = np.unique(ids, return_inverse=True)
        n = names.size
        last = np.full(n, -1, dtype=np.int64)
        np.maximum.at(last, codes, ep)
        age = last[codes] - ep
        w = self.decay ** age.astype(np.float64)
        mean, (q50, q90) = grouped_quantiles(codes, ln, w, n, (0.5, 0.9))
        drift, self.epoch_sd = self._fit_change(codes, ep, ln, n)
        self.drift = drift if self.drift_correction else 0.0
        if self.epoch_sd > 0:
            # a new epoch moves the whole group (sd epoch_sd in log space) on top of the spread within it
            lo, hi = np.log(q50), np.log(q90)
            q90 = np.exp(lo + np.sqrt((hi - lo) ** 2 + (_Z90 * self.epoch_sd) ** 2))
        if self.drift:
            # extrapolate from each prompt's weighted epoch to the next epoch overall
            wep = np.bincount(codes, weights=w * ep, minlength=n) / np.bincount(codes, weights=w, minlength=n)
            f = np.exp(self.drift * (ep.max() + 1 - wep))
            mean, q50, q90 = mean * f, q50 * f, q90 * f
        self._names = names
        self._index = {}
        self._stats = (mean, q50, q90)

    def _fit_change(self, codes: np.ndarray, ep: np.ndarray, ln: np.ndarray, n: int) -> tuple[float, float]:
        """(median log-change of a prompt's mean per epoch, robust sd of one epoch's per-prompt change)."""
        epochs = np.unique(ep)
        if epochs.size < 2:
            return 0.0, 0.0
        e1, e0 = epochs[-1], epochs[-2]
        logs = np.log(ln)
        m = []
        for e in (e0, e1):
            sel = ep == e
            cnt = np.bincount(codes[sel], minlength=n)
            s = np.bincount(codes[sel], weights=logs[sel], minlength=n)
            m.append((s, cnt))
        both = (m[0][1] > 0) & (m[1][1] > 0)
        if both.sum() < 8:
            return 0.0, 0.0
        change = m[1][0][both] / m[1][1][both] - m[0][0][both] / m[0][1][both]
        med = float(np.median(change))
        d = med / float(e1 - e0)
        # the change of two noisy epoch means: sd of one epoch's shift is MAD * 1.4826 / sqrt(2)
        sd = float(np.median(np.abs(change - med))) * 1.4826 / np.sqrt(2.0)
        return float(np.clip(d, -self.max_drift, self.max_drift)), sd

    def predict_many(self, prompt_ids: ArrayLike, prompt_lens: ArrayLike) -> Estimates:
        self._fit()
        ids = np.asarray(prompt_ids).astype(str)
        est = self.cold.predict_many(ids, prompt_lens)
        if self._names.size == 0 or ids.size == 0:
            return est
        pos = np.searchsorted(self._names, ids)
        pos = np.minimum(pos, self._names.size - 1)
        seen = self._names[pos] == ids
        mean, q50, q90 = self._stats
        est.mean[seen] = mean[pos[seen]]
        est.q50[seen] = q50[pos[seen]]
        est.q90[seen] = q90[pos[seen]]
        est.source[seen] = "history"
        return est

    def predict(self, prompt_id: str, prompt_len: int) -> LengthEstimate:
        return self.predict_many(np.array([prompt_id]), np.array([prompt_len])).at(0)
