"""Trajectory predictor for multi-turn (tool-calling) rollouts: total tokens, turns and tool wait.

A tool-calling trajectory is decode segments (its turns) separated by tool waits. Two numbers decide
how it loads an instance and when it finishes: the model tokens it decodes over all its turns (decode
capacity, what the planner balances) and the seconds it waits on its tools (latency only: a waiting
trajectory holds no decode slot). Both persist per prompt the way a single response's length does (a
task that needed five calculator calls needs about as many next epoch), so each is predicted from the
prompt's own history:

- total model tokens: any single-turn predictor (`history` by default) fed trajectory totals;
- turns and tool-wait seconds: per prompt, recency-weighted means of its earlier epochs (the same
  `decay**age` weights as `history`), the population mean for a prompt never seen, 0 / 1 turn before
  anything was observed.

`predict_many` gives the planner what it packs, in tokens, so plans are made exactly as for
single-turn samples: `mean` / `q50` are the predicted decode tokens (capacity), `q90` -- the planner's
"longest", the unit-time and stream-dispatch tail term -- adds the predicted tool wait as the decode
steps it spans (`wait_s / step_s`, `step_s` the cost model's step at full batch), since the tail a
trainer waits for is decode time plus tool time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from asp_npu.predict.base import Estimates, Predictor, grouped_quantiles
from asp_npu.types import LengthEstimate


@dataclass
class TrajectoryEstimates:
    """Columnar per-prompt predictions of a trajectory."""

    tokens: Estimates  # total model tokens over all turns
    turns: np.ndarray  # (n,) predicted turns
    wait_s: np.ndarray  # (n,) predicted seconds of tool waits


class _PromptMean:
    """Per-prompt recency-weighted mean of one per-trajectory number (population mean when unseen)."""

    def __init__(self, decay: float, prior: float) -> None:
        self.decay, self.prior = decay, prior
        self.ids: list[np.ndarray] = []
        self.ep: list[np.ndarray] = []
        self.val: list[np.ndarray] = []

    def add(self, ids: np.ndarray, epochs: np.ndarray, values: np.ndarray) -> None:
        self.ids.append(ids)
        self.ep.append(epochs)
        self.val.append(values)

    def predict(self, query: np.ndarray) -> np.ndarray:
        out = np.full(query.size, self.prior)
        if not self.ids:
            return out
        ids, ep, val = (np.concatenate(x) for x in (self.ids, self.ep, self.val))
        names, codes = np.unique(ids, return_inverse=True)
        last = np.full(names.size, -1, dtype=np.int64)
        np.maximum.at(last, codes, ep)
        w = self.decay ** (last[codes] - ep).astype(np.float64)
        mean, _ = grouped_quantiles(codes, val, w, names.size, ())
        out[:] = float(val.mean())
        pos = np.minimum(np.searchsorted(names, query), names.size - 1)
        seen = names[pos] == query
        out[seen] = mean[pos[seen]]
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        """Every observation as plain arrays (a checkpoint carries them)."""
        if not self.ids:
            return {"ids": np.array([], dtype=str), "epochs": np.array([], dtype=np.int64),
                    "values": np.array([], dtype=np.float64)}
        return {"ids": np.concatenate(self.ids), "epochs": np.concatenate(self.ep),
                "values": np.concatenate(self.val)}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.ids, self.ep, self.val = [], [], []
        ids = np.asarray(state["ids"]).astype(str)
        if ids.size:
            self.add(ids, np.asarray(state["epochs"], dtype=np.int64),
                     np.asarray(state["values"], dtype=np.float64))


class TrajectoryPredictor:
    """Wraps a token predictor; observes whole trajectories (see module docstring)."""

    name = "trajectory"

    def __init__(self, tokens: Predictor, step_s: float, decay: float = 0.6) -> None:
        if not step_s > 0:
            raise ValueError(f"step_s must be > 0 (got {step_s})")
        self.tokens, self.step_s = tokens, step_s
        self._turns = _PromptMean(decay, 1.0)
        self._wait = _PromptMean(decay, 0.0)

    def observe_trajectories(self, prompt_ids: ArrayLike, epochs: ArrayLike, total_tokens: ArrayLike,
                             turns: ArrayLike, wait_s: ArrayLike,
                             prompt_lens: ArrayLike | None = None) -> None:
        """Finished trajectories: model tokens over all turns, turn counts, seconds of tool waits."""
        ids = np.asarray(prompt_ids).astype(str)
        ep = np.broadcast_to(np.asarray(epochs, dtype=np.int64), ids.shape).copy()
        self.tokens.observe_many(ids, ep, np.asarray(total_tokens), None if prompt_lens is None
                                 else np.asarray(prompt_lens))
        self._turns.add(ids, ep, np.asarray(turns, dtype=np.float64))
        self._wait.add(ids, ep, np.asarray(wait_s, dtype=np.float64))

    def state_dict(self) -> dict[str, object]:
        """What a checkpoint carries: the token predictor's observations, turns and waits (a resumed run
        plans as this one would)."""
        inner = self.tokens.state_dict() if hasattr(self.tokens, "state_dict") else None
        return {"name": self.name, "tokens": inner, "turns": self._turns.state_dict(),
                "wait_s": self._wait.state_dict()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        if state.get("tokens") is not None and hasattr(self.tokens, "load_state_dict"):
            self.tokens.load_state_dict(state["tokens"])
        self._turns.load_state_dict(state["turns"])  # type: ignore[arg-type]
        self._wait.load_state_dict(state["wait_s"])  # type: ignore[arg-type]

    def summary(self) -> dict[str, object]:
        """What it has observed (a run's summary.json records it)."""
        turns, wait = self._turns.state_dict()["values"], self._wait.state_dict()["values"]
        return {"name": self.name, "tokens": getattr(self.tokens, "name", type(self.tokens).__name__),
                "step_s": self.step_s, "trajectories": int(turns.size),
                "turns_mean": float(turns.mean()) if turns.size else 0.0,
                "tool_wait_s_mean": float(wait.mean()) if wait.size else 0.0}

    def predict_trajectories(self, prompt_ids: ArrayLike, prompt_lens: ArrayLike) -> TrajectoryEstimates:
        ids = np.asarray(prompt_ids).astype(str)
        est = self.tokens.predict_many(ids, np.asarray(prompt_lens))
        return TrajectoryEstimates(est, self._turns.predict(ids), self._wait.predict(ids))

    def predict_many(self, prompt_ids: np.ndarray, prompt_lens: np.ndarray) -> Estimates:
        """The planner's input: decode tokens, with the tool wait (in decode steps) on the tail q90."""
        t = self.predict_trajectories(prompt_ids, prompt_lens)
        e = t.tokens
        return Estimates(e.prompt_ids, e.mean.copy(), e.q50.copy(), e.q90 + t.wait_s / self.step_s, e.source)

    def predict(self, prompt_id: str, prompt_len: int) -> LengthEstimate:
        return self.predict_many(np.array([prompt_id]), np.array([prompt_len])).at(0)

    # single-turn observations (the Predictor protocol): a one-turn trajectory without tool calls
    def observe(self, prompt_id: str, epoch: int, response_len: int, prompt_len: int | None = None) -> None:
        self.observe_trajectories([prompt_id], [epoch], [response_len], [1], [0.0],
                                  None if prompt_len is None else [prompt_len])

    def observe_many(self, prompt_ids: np.ndarray, epochs: np.ndarray, response_lens: np.ndarray,
                     prompt_lens: np.ndarray | None = None) -> None:
        n = np.asarray(response_lens).size
        self.observe_trajectories(prompt_ids, epochs, response_lens, np.ones(n), np.zeros(n), prompt_lens)

    def reveal(self, prompt_ids: np.ndarray, response_lens: np.ndarray) -> None:
        """The oracle's tokens (turns and waits stay predicted from history)."""
        reveal = getattr(self.tokens, "reveal", None)
        if reveal is not None:
            reveal(prompt_ids, response_lens)
