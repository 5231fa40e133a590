"""The real pipeline's predictor wiring for multi-turn runs (pure logic, no engines): the queue actor's
arrival carries each trajectory's model tokens, turns and tool wait, the controller feeds them to the
`TrajectoryPredictor`, and the planner's input is what the simulator's wiring gives for the same
trajectories."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from asp_npu.pipeline.controller import observe_arrival
from asp_npu.pipeline.queue_actor import QueueService
from asp_npu.predict.factory import make_predictor, make_run_predictor
from asp_npu.predict.history import HistoryPredictor
from asp_npu.predict.trajectory import TrajectoryPredictor
from asp_npu.types import Trajectory

STEP_S = 0.25


def _traj(gid: str, k: int, model: int, tool: int, turns: int, tool_s: float) -> Trajectory:
    """`model` tokens of the model's own and `tool` tokens of tool output (masked), as a rollout builds."""
    n = model + tool
    mask = [1] * (model // 2) + [0] * tool + [1] * (model - model // 2)
    return Trajectory(gid, k, [1, 2, 3], [5] * n, [-0.1] * n, "stop", 1.0, 0, instance=0, loss_mask=mask,
                      turns=turns, tool_calls=turns - 1, tool_s=tool_s)


def _arrivals(groups: dict[str, list[Trajectory]]):
    async def scenario():
        q = QueueService(minibatch_groups=len(groups), version_groups=len(groups), max_lag=1, group_size=2)
        assert await q.admit(list(groups), 0)
        for g in groups.values():
            await q.put_group(g)
        rows, _, _ = await q.wait_arrivals(0, 0.0)
        return rows

    return asyncio.run(scenario())


def test_run_predictor_is_the_trajectory_one_only_for_multi_turn():
    assert isinstance(make_run_predictor("history", True, STEP_S), TrajectoryPredictor)
    p = make_run_predictor("history", False, STEP_S)
    assert isinstance(p, HistoryPredictor) and not isinstance(p, TrajectoryPredictor)


def test_arrival_carries_model_tokens_turns_and_tool_wait():
    rows = _arrivals({"p@0": [_traj("p@0", 0, 10, 7, 2, 0.5), _traj("p@0", 1, 20, 0, 1, 0.0)]})
    (r,) = rows
    assert r.lens == (17, 20)  # the response, tool output included
    assert r.model_lens == (10, 20) and r.turns == (2, 1) and r.tool_s == (0.5, 0.0)


def test_controller_feeds_whole_trajectories_and_plans_with_the_tool_wait():
    rows = _arrivals({
        "p@0": [_traj("p@0", 0, 10, 7, 2, 1.5), _traj("p@0", 1, 12, 7, 3, 2.5)],
        "q@0": [_traj("q@0", 0, 30, 0, 1, 0.0), _traj("q@0", 1, 34, 0, 1, 0.0)],
    })
    pred = make_run_predictor("history", True, STEP_S)
    for r in rows:
        observe_arrival(pred, r)
    ref = make_predictor("history")  # what the token predictor alone learns from the model tokens
    ref.observe_many(np.array(["p", "p", "q", "q"]), np.zeros(4, dtype=np.int64), np.array([10, 12, 30, 34]),
                     np.full(4, 3))
    ids, plens = np.array(["p", "q"]), np.array([3, 3])
    got, want = pred.predict_many(ids, plens), ref.predict_many(ids, plens)
    np.testing.assert_allclose(got.mean, want.mean)  # tool-output tokens are no decode work
    np.testing.assert_allclose(got.q90, want.q90 + np.array([2.0, 0.0]) / STEP_S)  # mean wait 2 s = 8 steps
    t = pred.predict_trajectories(ids, plens)
    np.testing.assert_allclose(t.turns, [2.5, 1.0])
    s = pred.summary()
    assert (s["name"], s["trajectories"], s["turns_mean"]) == ("trajectory", 4, 1.75)
    assert s["tool_wait_s_mean"] == 1.0
    back = make_run_predictor("history", True, STEP_S)  # a resumed run plans as this one would
    back.load_state_dict(pred.state_dict())
    np.testing.assert_allclose(back.predict_many(ids, plens).q90, got.q90)
    np.testing.assert_allclose(back.predict_trajectories(ids, plens).turns, t.turns)


def test_single_turn_runs_observe_response_lengths_as_before():
    rows = _arrivals({"p@0": [_traj("p@0", 0, 10, 0, 1, 0.0), _traj("p@0", 1, 14, 0, 1, 0.0)]})
    pred = make_run_predictor("history", False, STEP_S)
    observe_arrival(pred, rows[0])
    ref = make_predictor("history")
    for n in (10, 14):
        ref.observe("p", 0, n, 3)
    np.testing.assert_allclose(pred.predict_many(np.array(["p"]), np.array([3])).q90,
                               ref.predict_many(np.array(["p"]), np.array([3])).q90)


@pytest.mark.parametrize("multi_turn", [True, False])
def test_trajectory_predictor_state_of_an_empty_run_round_trips(multi_turn):
    pred = make_run_predictor("history", multi_turn, STEP_S)
    back = make_run_predictor("history", multi_turn, STEP_S)
    back.load_state_dict(pred.state_dict())
    assert back.predict_many(np.array(["x"]), np.array([4])).mean.shape == (1,)
