"""The predictor protocol and the columnar estimate type shared by all predictors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike

from asp_npu.types import LengthEstimate


@dataclass
class Estimates:
    """Columnar LengthEstimates (one row per queried prompt) -- what the planner consumes."""

    prompt_ids: np.ndarray  # (n,) str
    mean: np.ndarray  # (n,) float64, predicted response tokens
    q50: np.ndarray
    q90: np.ndarray
    source: np.ndarray  # (n,) str: history | prompt-len | population | oracle

    def __len__(self) -> int:
        return int(self.mean.shape[0])

    def at(self, i: int) -> LengthEstimate:
        return LengthEstimate(
            str(self.prompt_ids[i]),
            float(self.mean[i]),
            float(self.q50[i]),
            float(self.q90[i]),
            str(self.source[i]),
        )


@runtime_checkable
class Predictor(Protocol):
    """Online response-length predictor: fed every finished sample, asked before dispatch."""

    name: str

    def observe(
        self, prompt_id: str, epoch: int, response_len: int, prompt_len: int | None = None
    ) -> None: ...

    def observe_many(
        self,
        prompt_ids: np.ndarray,
        epochs: np.ndarray,
        response_lens: np.ndarray,
        prompt_lens: np.ndarray | None = None,
    ) -> None: ...

    def predict(self, prompt_id: str, prompt_len: int) -> LengthEstimate: ...

    def predict_many(self, prompt_ids: np.ndarray, prompt_lens: np.ndarray) -> Estimates: ...


class ObservationLog:
    """Append-only columnar log of finished samples; single observations are buffered in lists."""

    def __init__(self) -> None:
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._pending: tuple[list[Any], list[Any], list[Any], list[Any]] = ([], [], [], [])
        self.version = 0  # bumps on every change, so fitted state knows when it is stale

    def add(self, prompt_id: str, epoch: int, response_len: int, prompt_len: int | None) -> None:
        if response_len <= 0:
            raise ValueError(f"response_len must be > 0 (got {response_len})")
        for col, v in zip(
            self._pending,
            (str(prompt_id), epoch, response_len, -1 if prompt_len is None else prompt_len),
            strict=True,
        ):
            col.append(v)
        self.version += 1

    def add_many(
        self,
        prompt_ids: ArrayLike,
        epochs: ArrayLike,
        response_lens: ArrayLike,
        prompt_lens: ArrayLike | None = None,
    ) -> None:
        ids = np.asarray(prompt_ids).astype(str)
        lens = np.asarray(response_lens, dtype=np.float64)
        if lens.size and lens.min() <= 0:
            raise ValueError("response lengths must be > 0")
        ep = np.broadcast_to(np.asarray(epochs, dtype=np.int64), ids.shape)
        pl = np.full(ids.shape, -1.0) if prompt_lens is None else np.asarray(prompt_lens, dtype=np.float64)
        self._chunks.append((ids, np.array(ep), lens, pl))
        self.version += 1

    def state_dict(self) -> dict[str, np.ndarray]:
        """Every observation, as plain arrays (a checkpoint carries them)."""
        ids, ep, ln, pl = self.arrays()
        return {"prompt_ids": ids.copy(), "epochs": ep.copy(), "response_lens": ln.copy(),
                "prompt_lens": pl.copy()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Replace the log by a `state_dict` (fitted state goes stale through the version bump)."""
        self._chunks = []
        self._pending = ([], [], [], [])
        ids = np.asarray(state["prompt_ids"]).astype(str)
        if ids.size:
            self._chunks.append((ids, np.asarray(state["epochs"], dtype=np.int64),
                                 np.asarray(state["response_lens"], dtype=np.float64),
                                 np.asarray(state["prompt_lens"], dtype=np.float64)))
        self.version += 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(prompt_ids str, epochs int64, response_lens float64, prompt_lens float64; -1 = unknown)."""
        if self._pending[0]:
            ids, ep, ln, pl = self._pending
            self._chunks.append(
                (
                    np.asarray(ids, dtype=str),
                    np.asarray(ep, dtype=np.int64),
                    np.asarray(ln, dtype=np.float64),
                    np.asarray(pl, dtype=np.float64),
                )
            )
            self._pending = ([], [], [], [])
        if len(self._chunks) > 1:
            cols = [np.concatenate(c) for c in zip(*self._chunks, strict=True)]
            self._chunks = [(cols[0], cols[1], cols[2], cols[3])]
        if not self._chunks:
            return np.array([], dtype=str), np.array([], dtype=np.int64), np.array([]), np.array([])
        return self._chunks[0]


def grouped_quantiles(
    codes: np.ndarray, values: np.ndarray, weights: np.ndarray, n_groups: int, qs: tuple[float, ...]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Weighted mean and weighted quantiles of `values` per group code, vectorised (no per-group loop).

    Groups without observations get NaN.
    """
    mean = np.full(n_groups, np.nan)
    out = [np.full(n_groups, np.nan) for _ in qs]
    if values.size == 0:
        return mean, out
    wsum = np.bincount(codes, weights=weights, minlength=n_groups)
    has = wsum > 0
    mean[has] = np.bincount(codes, weights=weights * values, minlength=n_groups)[has] / wsum[has]
    order = np.lexsort((values, codes))
    c, v, w = codes[order], values[order], weights[order]
    cw = np.cumsum(w)
    first = np.searchsorted(c, np.arange(n_groups), side="left")
    base = np.where(first > 0, cw[np.maximum(first - 1, 0)], 0.0)
    frac = (cw - base[c]) / np.where(has, wsum, 1.0)[c]  # within-group cumulative weight share
    for q, arr in zip(qs, out, strict=True):
        # first row of each group whose cumulative share reaches q
        key = c.astype(np.float64) + np.minimum(frac, 1.0) * 0.999999  # sortable (group, share)
        idx = np.searchsorted(key, np.arange(n_groups) + q * 0.999999 - 1e-12, side="left")
        idx = np.minimum(idx, c.size - 1)
        arr[has] = v[idx[has]]
    return mean, out
