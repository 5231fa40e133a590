"""The trajectory predictor (multi-turn): total tokens, turns and tool wait from a prompt's history."""

from __future__ import annotations

import numpy as np
import pytest

from asp_npu.data.traces import MultiTurnParams, synth_multiturn
from asp_npu.predict.factory import make_predictor
from asp_npu.predict.trajectory import TrajectoryPredictor


def test_turns_and_wait_follow_each_prompts_history() -> None:
    p = TrajectoryPredictor(make_predictor("history"), step_s=0.5)
    before = p.predict_trajectories(np.array(["a"]), np.array([10]))
    assert before.turns[0] == 1.0 and before.wait_s[0] == 0.0  # nothing observed yet
    p.observe_trajectories(["a"] * 4 + ["b"] * 4, 0, [800] * 4 + [100] * 4, [6] * 4 + [1] * 4,
                           [12.0] * 4 + [0.0] * 4, [10] * 8)
    p.observe_trajectories(["a"] * 4, 1, [900] * 4, [4] * 4, [8.0] * 4, [10] * 4)
    t = p.predict_trajectories(np.array(["a", "b", "new"]), np.array([10, 10, 10]))
    w = 1.0 / (1.0 + 0.6)  # epoch 1 weighs 1, epoch 0 weighs 0.6
    assert t.turns[0] == pytest.approx(4 * w + 6 * 0.6 * w)
    assert t.wait_s[0] == pytest.approx(8 * w + 12 * 0.6 * w)
    assert t.turns[1] == 1.0 and t.wait_s[1] == 0.0
    assert t.turns[2] == pytest.approx(np.mean([6] * 4 + [1] * 4 + [4] * 4))  # population for the unseen
    est = p.predict_many(np.array(["a", "b"]), np.array([10, 10]))
    tok = t.tokens
    assert np.allclose(est.mean, tok.mean[:2]) and np.allclose(est.q50, tok.q50[:2])
    assert est.q90[0] == pytest.approx(tok.q90[0] + t.wait_s[0] / 0.5)  # the wait, in decode steps
    assert est.q90[1] == pytest.approx(tok.q90[1])


@pytest.mark.parametrize("shape", ["geometric", "bimodal"])
def test_history_ranks_trajectories_on_both_shapes(shape) -> None:
    """Epoch 3 of a generated trace, predicted from epochs 0-2: per-prompt mean total tokens, turns
    and tool wait rank with the truth (Spearman), on both turn-count shapes."""
    tr = synth_multiturn(MultiTurnParams(prompts=300, epochs=4, n=8, shape=shape, seed=5))
    turns = tr.turns
    assert turns is not None
    wait, counts = turns.per_row(turns.tool_s), turns.counts
    p = TrajectoryPredictor(make_predictor("history"), step_s=0.1)
    past = tr.epoch < 3
    p.observe_trajectories(tr.prompt_names[tr.prompt_code[past]], tr.epoch[past], tr.response_len[past],
                           counts[past], wait[past], tr.prompt_len[past])
    cur = tr.epoch == 3
    ids = tr.prompt_names[np.arange(300)]
    est = p.predict_trajectories(ids, np.ones(300))

    def spearman(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.corrcoef(np.argsort(np.argsort(a)), np.argsort(np.argsort(b)))[0, 1])

    code = tr.prompt_code[cur]
    truth = [np.bincount(code, weights=x[cur], minlength=300) / 8 for x in (tr.response_len, counts, wait)]
    assert spearman(est.tokens.mean, truth[0]) > 0.6
    assert spearman(est.turns, truth[1]) > 0.5
    assert spearman(est.wait_s, truth[2]) > 0.3
