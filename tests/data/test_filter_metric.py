"""DAPO dynamic sampling's filter metric (`rl_config.filter_groups_metric`): the shaped reward, the
verifiers' score before shaping, or one verifier's own score -- on hand-built groups where they differ."""

from __future__ import annotations

import asyncio

import pytest

from asp_npu.config import Config, validate
from asp_npu.data.rewards import RewardSpec, run_verifier
from asp_npu.data.shaping import DapoShaping, dapo_shaping, filter_values
from asp_npu.pipeline.queue_actor import QueueService
from asp_npu.types import Trajectory

# two right DAPO answers (verl math_dapo / MindSpeed-RL acc_for_dapo: "Answer: ..." -> +1), the second
# one deep in the overlong buffer (max_tokens 64, buffer 16: 60 tokens lose (60 - 48) / 16 = 0.75)
RIGHT_SHORT = "<think>3 times 14</think>\n<answer>\\boxed{42}</answer>\nAnswer: 42"
RIGHT_LONG_NO_FORMAT = "three times fourteen is forty-two, so\nAnswer: 42"
LENGTHS = [10, 60]


def _group(gid: str, responses: list[str], names: list[str], weights: list[float]) -> list[Trajectory]:
    """A group scored by the real verifiers (in this process): reward = weighted sum, scores recorded."""
    spec = RewardSpec(tuple(names), tuple(weights))
    out = []
    for k, (text, n) in enumerate(zip(responses, LENGTHS, strict=True)):
        scores = {name: run_verifier(name, spec, "math_dapo", text, "42") for name in names}
        reward = sum(w * scores[name] for name, w in zip(names, weights, strict=True))
        out.append(Trajectory(gid, k, [1, 2], [5] * n, [-0.1] * n, "stop", reward, 0, instance=0,
                              scores=scores))
    return out


def _filtered(metric: str, group: list[Trajectory]) -> bool:
    async def put() -> bool:
        s = DapoShaping(filter_groups=True, overlong=True, max_tokens=64, overlong_buffer=16,
                        filter_metric=metric)
        q = QueueService(minibatch_groups=1, version_groups=1, max_lag=1, group_size=2, shaping=s)
        assert await q.admit([group[0].prompt_id], 0)
        await q.put_group(group)
        (arrival,), _, _ = await q.wait_arrivals(0, 0.0)
        return arrival.filtered

    return asyncio.run(put())


def test_right_answers_of_different_lengths_reward_trains_them_acc_filters_them():
    """Both answers right: the shaped rewards differ only by the overlong penalty (1.0 vs 0.25), so
    `reward` keeps the group (it teaches brevity); `score` and the verifier's own score are all +1:
    filtered, as MindSpeed-RL's `filter_groups_metric: acc_for_dapo` filters it."""
    group = _group("g", [RIGHT_SHORT, RIGHT_LONG_NO_FORMAT], ["acc_for_dapo"], [1.0])
    assert [t.scores["acc_for_dapo"] for t in group] == [1.0, 1.0]
    assert not _filtered("reward", [_copy(t) for t in group])
    assert _filtered("score", [_copy(t) for t in group])
    assert _filtered("acc_for_dapo", [_copy(t) for t in group])


def test_one_verifier_of_a_sum_decides_where_named():
    """reward = acc_for_dapo + format: both right, only the first in the <think>/<answer> format. The
    sum differs (2 vs 1): `score` keeps the group; `acc_for_dapo` alone is equal: filtered."""
    group = _group("g", [RIGHT_SHORT, RIGHT_LONG_NO_FORMAT], ["acc_for_dapo", "format"], [1.0, 1.0])
    assert [t.scores for t in group] == [{"acc_for_dapo": 1.0, "format": 1.0},
                                         {"acc_for_dapo": 1.0, "format": 0.0}]
    assert not _filtered("score", [_copy(t) for t in group])
    assert _filtered("acc_for_dapo", [_copy(t) for t in group])
    assert not _filtered("format", [_copy(t) for t in group])


def test_filter_values_reads_the_chosen_metric():
    shaped, unshaped, scores = [1.0, 0.25], [1.0, 1.0], [{"acc": 1.0}, {"acc": -0.5}]
    assert filter_values("reward", shaped, unshaped, scores) == shaped
    assert filter_values("score", shaped, unshaped, scores) == unshaped
    assert filter_values("acc", shaped, unshaped, scores) == [1.0, -0.5]


def _copy(t: Trajectory) -> Trajectory:
    return Trajectory(**{**t.to_dict(), "scores": dict(t.scores)})


def _cfg(metric: str, verifiers: list[str], enable: bool = True) -> Config:
    cfg = Config()
    cfg.rl_config.drop_equal_reward_groups = enable
    cfg.rl_config.filter_groups_metric = metric
    cfg.reward.verifier_function = verifiers
    return cfg


@pytest.mark.parametrize(("metric", "verifiers"), [("reward", []), ("score", ["acc"]), ("acc_for_dapo",
                         ["acc_for_dapo"]), ("auto", []), ("format", ["acc_for_dapo", "format"])])
def test_accepted_metrics(metric, verifiers):
    cfg = _cfg(metric, verifiers)
    assert not [p for p in validate(cfg) if "filter_groups_metric" in p]
    assert dapo_shaping(cfg, 4, 2).filter_metric == metric


def test_a_metric_no_verifier_records_is_one_line():
    problems = [p for p in validate(_cfg("acc", ["acc_for_dapo"])) if "filter_groups_metric" in p]
    assert problems == ["rl_config.filter_groups_metric: 'acc' is not reward | score nor a verifier in "
                        "reward.verifier_function ['acc_for_dapo']"]
    assert not [p for p in validate(_cfg("acc", ["acc_for_dapo"], enable=False)) if "filter_groups" in p]
