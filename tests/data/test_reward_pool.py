"""The verifier pool: a verifier that hangs, raises or dies is cut (timeout / error), scores 0, is counted,
and the pool goes on; the scorer's weighted sum and the custom reward hook run through it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from asp_npu.data.reward_pool import ERROR, OK, TIMEOUT, VerifierPool
from asp_npu.data.rewards import RewardScorer, RewardSpec
from tests.data import pool_targets as t


@pytest.fixture
def pool():
    p = VerifierPool(num_workers=1, timeout_s=1.0)
    yield p
    p.close()


def test_a_hung_verifier_is_cut_and_its_worker_replaced(pool):
    first = pool.call(t.pid, 0.0)
    assert pool.call(t.sleep_forever, 1.0) == (0.0, TIMEOUT)
    after = pool.call(t.pid, 0.0)
    assert first[1] == after[1] == OK and first[0] != after[0]  # a fresh process took the slot
    assert pool.call(t.score, 0.75) == (0.75, OK)
    assert pool.stats.as_dict() == {"calls": 4, "timeouts": 1, "errors": 0, "workers_replaced": 1}


def test_a_raising_verifier_scores_zero_and_the_worker_lives_on(pool):
    before = pool.call(t.pid, 0.0)[0]
    assert pool.call(t.boom, 1.0) == (0.0, ERROR)
    assert pool.call(t.not_finite, 1.0) == (0.0, ERROR)
    assert pool.call(t.pid, 0.0)[0] == before
    assert pool.stats.errors == 2 and pool.stats.workers_replaced == 0


def test_a_dying_worker_is_replaced(pool):
    assert pool.call(t.die, 1.0) == (0.0, ERROR)
    assert pool.call(t.score, 2.0) == (2.0, OK)
    assert pool.stats.workers_replaced == 1


def test_a_hang_does_not_stall_other_callers():
    """Two workers, one stuck: the other callers' calls all complete with their own values."""
    with VerifierPool(num_workers=2, timeout_s=5.0) as pool:
        results: dict[int, tuple[float, str]] = {}

        def run(i: int) -> None:
            results[i] = pool.call(t.sleep_forever if i == 0 else t.score, float(i))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert results[0] == (0.0, TIMEOUT)
        assert all(results[i] == (float(i), OK) for i in range(1, 6))


def test_closed_pool_answers_at_once():
    pool = VerifierPool(num_workers=1, timeout_s=1.0)
    pool.close()
    assert pool.call(t.score, 1.0) == (0.0, ERROR)


CUSTOM = '''
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    mode = (extra_info or {}).get("mode")
    if mode == "hang":
        while True:
            time.sleep(60)
    if mode == "boom":
        raise RuntimeError("verifier bug")
    if mode == "dict":
        return {"score": 0.5, "acc": True}
    return 1.0 if solution_str.strip() == ground_truth else 0.0
'''


def test_scorer_weighted_sum_with_a_custom_function(tmp_path: Path):
    path = tmp_path / "my_reward.py"
    path.write_text(CUSTOM)
    spec = RewardSpec(("custom", "format", "auto"), (1.0, 0.5, 2.0), f"{path}:compute_score", timeout_s=2.0,
                      num_workers=1)
    scorer = RewardScorer(spec)
    try:
        right = "<think>x</think><answer>7</answer>"
        ok = scorer.score("asp/count", right, right)
        assert ok.parts == {"custom": 1.0, "format": 1.0, "auto": 1.0} and ok.value == 1.0 + 0.5 + 2.0
        assert ok.failures == 0
        as_dict = scorer.score("asp/count", right, right, {"mode": "dict"})
        assert as_dict.parts["custom"] == 0.5  # verl's dict return: its `score`
        hung = scorer.score("asp/count", right, right, {"mode": "hang"})
        assert hung.parts["custom"] == 0.0 and hung.failures == 1 and hung.value == 0.5 + 2.0
        boom = scorer.score("asp/count", right, right, {"mode": "boom"})
        assert boom.failures == 1 and boom.value == 2.5
        assert scorer.stats() == {"calls": 12, "timeouts": 1, "errors": 1, "workers_replaced": 1}
    finally:
        scorer.close()


def test_default_spec_keeps_the_synthetic_task_reward():
    """No reward settings: the data_source rule, partial credit for the synthetic tasks (the CPU demo)."""
    scorer = RewardScorer()
    try:
        assert scorer.score("asp/count", "1 2 3", "1 2 3").value == 1.0
        assert scorer.score("asp/count", "1 2", "1 2 3").value == pytest.approx(2 / 3)
        assert scorer.score("asp/rle", "aab", "aaa").value == pytest.approx(2 / 3)
        assert scorer.score("openai/gsm8k", "so\n#### 72", "72").value == 1.0  # verl's gsm8k rule
        assert scorer.score("openai/gsm8k", "so 72", "72").value == 0.0  # strict: needs `####`
        assert scorer.score("", "\\boxed{\\frac{1}{2}}", "0.5").value == 1.0  # asp-npu's lenient math
    finally:
        scorer.close()
