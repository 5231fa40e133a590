"""Response-length predictors (history, prompt features, oracle) and their evaluation.

Public contract (stable)::

    class Predictor(Protocol):                       # asp_npu.predict.base
        name: str
        def observe(self, prompt_id: str, epoch: int, response_len: int,
                    prompt_len: int | None = None) -> None      # online update, every finished sample
        def observe_many(self, prompt_ids, epochs, response_lens, prompt_lens=None) -> None  # columnar
        def predict(self, prompt_id: str, prompt_len: int) -> LengthEstimate
        def predict_many(self, prompt_ids, prompt_lens) -> Estimates   # columnar mean/q50/q90/source

    make_predictor(name: "history" | "prompt-len" | "oracle", **kw) -> Predictor   # .factory
    evaluate(trace, epoch, predictor_name) -> dict  # .evaluate: spearman, spearman_samples, mae, coverage_q90
    fitted_predictor(trace, epoch, name) / predict_epoch(trace, epoch, name)     # .evaluate

Multi-turn trajectories -- `asp_npu.predict.trajectory.TrajectoryPredictor(tokens_predictor, step_s)`:
`observe_trajectories(ids, epochs, total_tokens, turns, wait_s)`, `predict_trajectories(ids, plens)`
(total tokens, turns, tool-wait seconds per prompt from its history) and `predict_many`, the
planner's input: decode tokens, with the tool wait in decode steps added to q90.

`history` falls back to the cold-start `prompt-len` predictor for prompts it has never seen; the
`oracle` is told the true lengths of the epoch it predicts (`OraclePredictor.reveal(...)`).
"""

from asp_npu.predict.base import Estimates, Predictor  # noqa: E402
from asp_npu.predict.factory import make_predictor  # noqa: E402

__all__ = ["Estimates", "Predictor", "make_predictor"]
