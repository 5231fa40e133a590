"""`make_predictor(name)`: the one place that maps predictor names to classes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asp_npu.predict.base import Predictor
from asp_npu.predict.coldstart import PromptLenPredictor
from asp_npu.predict.history import HistoryPredictor
from asp_npu.predict.oracle import OraclePredictor
from asp_npu.predict.trajectory import TrajectoryPredictor

PREDICTORS: dict[str, Callable[..., Predictor]] = {
    "history": HistoryPredictor,
    "prompt-len": PromptLenPredictor,
    "oracle": OraclePredictor,
}


def make_predictor(name: str, **kwargs: Any) -> Predictor:
    if name not in PREDICTORS:
        raise ValueError(f"unknown predictor '{name}' (choose {', '.join(PREDICTORS)})")
    return PREDICTORS[name](**kwargs)


def make_run_predictor(name: str, multi_turn: bool, step_s: float) -> Predictor | TrajectoryPredictor:
    """A run's predictor: `name`, wrapped in the `TrajectoryPredictor` when rollouts are multi-turn (it
    is fed whole trajectories: model tokens, turns, tool-wait seconds); `step_s` is the planner cost
    model's decode step, which turns a predicted tool wait into the decode steps it spans."""
    inner = make_predictor(name)
    return TrajectoryPredictor(inner, step_s) if multi_turn else inner
