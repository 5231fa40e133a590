"""Cold-start predictor for prompts never seen: prompt-length regression on population statistics.

Fits `log(response) = alpha + beta * log(prompt_len)` by least squares on recent observations
(prompt length is a weak but real signal: longer problem statements tend to need longer solutions),
and turns the residual distribution into mean/q50/q90. With too little data (or no prompt lengths),
beta = 0 and it is the population distribution; with no data at all, a documented prior.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from asp_npu.predict.base import Estimates, ObservationLog
from asp_npu.types import LengthEstimate

PRIOR_MEDIAN = 2048.0  # tokens; reasoning-RL order of magnitude (ANCHORS.md: ~7.3k mean at 32K cap)
PRIOR_LOG_SD = 1.0  # p99 ~ 10x median (ANCHORS.md)
_Z90 = 1.2815515655446004


class PromptLenPredictor:
    """Population model conditioned on prompt length; also the fallback inside `history`."""

    name = "prompt-len"

    def __init__(self, window_epochs: int = 2, min_fit: int = 32) -> None:
        self.window_epochs = window_epochs  # fit on the last few epochs only, so drift is followed
        self.min_fit = min_fit
        self.log = ObservationLog()
        self._fit_version = -1
        self._coef = (np.log(PRIOR_MEDIAN), 0.0)
        self._resid = (np.exp(PRIOR_LOG_SD**2 / 2), 0.0, _Z90 * PRIOR_LOG_SD)  # E[e^r], q50(r), q90(r)
        self._fitted_on = 0

    def observe(self, prompt_id: str, epoch: int, response_len: int, prompt_len: int | None = None) -> None:
        self.log.add(prompt_id, epoch, response_len, prompt_len)

    def observe_many(
        self,
        prompt_ids: ArrayLike,
        epochs: ArrayLike,
        response_lens: ArrayLike,
        prompt_lens: ArrayLike | None = None,
    ) -> None:
        self.log.add_many(prompt_ids, epochs, response_lens, prompt_lens)

    def state_dict(self) -> dict[str, object]:
        """What a checkpoint carries: the observations (the fit is recomputed from them exactly)."""
        return {"name": self.name, "log": self.log.state_dict()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.log.load_state_dict(state["log"])  # type: ignore[arg-type]

    def _fit(self) -> None:
        if self._fit_version == self.log.version:
            return
        self._fit_version = self.log.version
        _, ep, ln, pl = self.log.arrays()
        if ln.size == 0:
            return
        keep = ep > ep.max() - self.window_epochs
        y = np.log(ln[keep])
        x = pl[keep]
        known = x > 0
        alpha, beta = float(np.median(y)), 0.0
        if known.sum() >= self.min_fit and np.ptp(np.log(x[known])) > 0:
            lx = np.log(x[known])
            beta, alpha = np.polyfit(lx, y[known], 1)
            resid = np.r_[y[known] - (alpha + beta * lx), y[~known] - alpha - beta * np.median(lx)]
        else:
            resid = y - alpha
        self._coef = (float(alpha), float(beta))
        self._resid = (
            float(np.mean(np.exp(resid))),
            float(np.quantile(resid, 0.5)),
            float(np.quantile(resid, 0.9)),
        )
        self._fitted_on = int(y.size)

    def predict_many(self, prompt_ids: ArrayLike, prompt_lens: ArrayLike) -> Estimates:
        self._fit()
        ids = np.asarray(prompt_ids).astype(str)
        pl = np.asarray(prompt_lens, dtype=np.float64)
        alpha, beta = self._coef
        centre = alpha + beta * np.log(np.maximum(pl, 1.0))
        emean, r50, r90 = self._resid
        src = "prompt-len" if beta != 0.0 else "population"
        return Estimates(
            ids,
            np.exp(centre) * emean,
            np.exp(centre + r50),
            np.exp(centre + r90),
            np.full(ids.shape, src, dtype="<U16"),
        )

    def predict(self, prompt_id: str, prompt_len: int) -> LengthEstimate:
        return self.predict_many(np.array([prompt_id]), np.array([prompt_len])).at(0)
