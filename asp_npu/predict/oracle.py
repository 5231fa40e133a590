"""Oracle predictor for experiments: told the true lengths of the epoch it will be asked about."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from asp_npu.predict.base import Estimates, ObservationLog, grouped_quantiles
from asp_npu.predict.coldstart import PromptLenPredictor
from asp_npu.types import LengthEstimate


class OraclePredictor:
    """Upper bound on what prediction can buy: exact per-prompt mean/median/q90 of the revealed epoch."""

    name = "oracle"

    def __init__(self) -> None:
        self.cold = PromptLenPredictor()
        self.truth = ObservationLog()

    def observe(self, prompt_id: str, epoch: int, response_len: int, prompt_len: int | None = None) -> None:
        self.cold.observe(prompt_id, epoch, response_len, prompt_len)

    def observe_many(
        self,
        prompt_ids: ArrayLike,
        epochs: ArrayLike,
        response_lens: ArrayLike,
        prompt_lens: ArrayLike | None = None,
    ) -> None:
        self.cold.observe_many(prompt_ids, epochs, response_lens, prompt_lens)

    def state_dict(self) -> dict[str, object]:
        return {"name": self.name, "cold": self.cold.state_dict(), "truth": self.truth.state_dict()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.cold.load_state_dict(state["cold"])  # type: ignore[arg-type]
        self.truth.load_state_dict(state["truth"])  # type: ignore[arg-type]

    def reveal(self, prompt_ids: ArrayLike, response_lens: ArrayLike) -> None:
        """The true lengths of the epoch to predict (replaces anything revealed before)."""
        self.truth = ObservationLog()
        self.truth.add_many(prompt_ids, 0, response_lens)

    def predict_many(self, prompt_ids: ArrayLike, prompt_lens: ArrayLike) -> Estimates:
        ids = np.asarray(prompt_ids).astype(str)
        est = self.cold.predict_many(ids, prompt_lens)
        tid, _, ln, _ = self.truth.arrays()
        if ln.size == 0 or ids.size == 0:
            return est
        names, codes = np.unique(tid, return_inverse=True)
        mean, (q50, q90) = grouped_quantiles(codes, ln, np.ones_like(ln), names.size, (0.5, 0.9))
        pos = np.minimum(np.searchsorted(names, ids), names.size - 1)
        seen = names[pos] == ids
        est.mean[seen], est.q50[seen], est.q90[seen] = mean[pos[seen]], q50[pos[seen]], q90[pos[seen]]
        est.source[seen] = "oracle"
        return est

    def predict(self, prompt_id: str, prompt_len: int) -> LengthEstimate:
        return self.predict_many(np.array([prompt_id]), np.array([prompt_len])).at(0)
