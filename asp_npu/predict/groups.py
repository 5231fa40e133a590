"""One epoch of a trace as the planner's input: its GRPO groups with length predictions.

Predictions use epochs before the planned one only (the oracle alone reads the planned epoch), so a
plan made from a trace is one the scheduler could have made online.
"""

from __future__ import annotations

from asp_npu.data.traces import Trace, group_table
from asp_npu.predict.evaluate import predict_epoch
from asp_npu.schedule.plan import Groups


def groups_for_epoch(trace: Trace, epoch: int, predictor: str) -> Groups:
    """The epoch's GRPO groups with predictions from epochs < `epoch` (the oracle reads `epoch`)."""
    cur, _, est = predict_epoch(trace, epoch, predictor)
    codes, rows, _ = group_table(cur)  # codes ascending, same order as the estimates
    return Groups(
        prompt_ids=trace.prompt_names[codes],
        sample_idxs=cur.sample_idx[rows],
        mean=est.mean,
        q50=est.q50,
        q90=est.q90,
        prompt_lens=cur.prompt_len[rows[:, 0]],
    )
