"""`make_predictor(name)`: the one place that maps predictor names to classes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asp_npu.predict.base import Predictor
from asp_npu.predict.coldstart import PromptLenPredictor
from asp_npu.predict.history import HistoryPredictor
from asp_npu.predict.oracle import OraclePredictor

PREDICTORS: dict[str, Callable[..., Predictor]] = {
    "history": HistoryPredictor,
    "prompt-len": PromptLenPredictor,
    "oracle": OraclePredictor,
}


def make_predictor(name: str, **kwargs: Any) -> Predictor:
    if name not in PREDICTORS:
        raise ValueError(f"unknown predictor '{name}' (choose {', '.join(PREDICTORS)})")
    return PREDICTORS[name](**kwargs)
