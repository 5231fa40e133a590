"""Synthetic tasks: answers are correct, lengths follow the requested distribution, rewards verify."""

from __future__ import annotations

import random
import re
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.data.rewards import (
    compute_reward,
    extract_answer,
    last_boxed,
    math_reward,
    reward_fn_for,
    task_reward,
)
from asp_npu.data.tasks import TASKS, LengthDist, answer_items, make_example, make_prompts, parse_length_dist
from asp_npu.errors import UserError


def test_prompts_are_deterministic_with_stable_ids():
    a = make_prompts("mix", 30, seed=4)
    b = make_prompts("mix", 30, seed=4)
    assert [(p.prompt_id, p.text, p.ground_truth) for p in a] == [
        (p.prompt_id, p.text, p.ground_truth) for p in b
    ]
    assert len({p.prompt_id for p in a}) == 30
    assert {p.meta["task"] for p in a} == set(TASKS)
    assert all(p.meta["data_source"] == f"asp/{p.meta['task']}" for p in a)
    assert make_prompts("count", 5, seed=5)[0].text != make_prompts("count", 5, seed=4)[0].text


def test_count_answers_follow_the_prompt():
    for p in make_prompts("count", 50, seed=1):
        a, b = map(int, re.match(r"Count from (\d+) to (\d+)\.", p.text).groups())
        step = 1 if b >= a else -1
        assert p.ground_truth == " ".join(str(x) for x in range(a, b + step, step))
        assert len(answer_items("count", p.ground_truth)) == p.meta["answer_items"]


def test_rle_answers_expand_the_code():
    for p in make_prompts("rle", 50, seed=2):
        code = p.text.removeprefix("Expand: ").split()
        assert p.ground_truth == "".join(tok[0] * int(tok[1:]) for tok in code)
        assert len(p.ground_truth) == p.meta["answer_items"]


def test_addsteps_answers_end_with_the_sum():
    for p in make_prompts("addsteps", 50, seed=3):
        a, b = map(int, re.match(r"Add (\d+)\+(\d+) step by step\.", p.text).groups())
        lines = p.ground_truth.splitlines()
        assert lines[-1] == f"sum {a + b}"
        assert len(lines) - 1 == max(len(str(a)), len(str(b))) == p.meta["answer_items"]


@settings(max_examples=60, deadline=None)
@given(task=st.sampled_from(TASKS), n=st.integers(1, 60), seed=st.integers(0, 10_000))
def test_answer_length_is_the_requested_item_count(task, n, seed):
    ex = make_example(task, random.Random(seed), n)
    extra = 1 if task == "addsteps" else 0  # the final "sum" line
    assert len(answer_items(task, ex.answer)) == n + extra
    assert task_reward(task, ex.answer, ex.answer) == 1.0


def test_length_distributions_are_controllable():
    rng = random.Random(0)
    logn = [LengthDist(median=10, sigma=1.2, max_items=10_000).sample(rng) for _ in range(4000)]
    q = statistics.quantiles(logn, n=100)
    assert 8 <= statistics.median(logn) <= 12 and q[98] / statistics.median(logn) > 8  # long tail
    assert {LengthDist(kind="fixed", median=7).sample(rng) for _ in range(50)} == {7}
    uni = [LengthDist(kind="uniform", min_items=3, max_items=9).sample(rng) for _ in range(2000)]
    assert min(uni) == 3 and max(uni) == 9
    bi = [
        LengthDist(
            kind="bimodal", median=5, median_long=200, sigma=0.1, frac_long=0.3, max_items=1000
        ).sample(rng)
        for _ in range(2000)
    ]
    assert 0.25 < sum(x > 50 for x in bi) / len(bi) < 0.35 and not any(20 < x < 100 for x in bi)
    par = [
        LengthDist(kind="pareto", median=10, alpha=1.2, max_items=100_000).sample(rng) for _ in range(4000)
    ]
    assert 7 <= statistics.median(par) <= 13 and max(par) > 500
    capped = [LengthDist(median=50, sigma=2, max_items=64).sample(rng) for _ in range(500)]
    assert max(capped) == 64 and min(capped) >= 1


def test_prompt_lengths_follow_the_dataset_distribution():
    short = make_prompts("count", 200, seed=1, dist=LengthDist(kind="fixed", median=3))
    long = make_prompts("count", 200, seed=1, dist=LengthDist(kind="fixed", median=40))
    assert {p.meta["answer_items"] for p in short} == {3} and {p.meta["answer_items"] for p in long} == {40}


def test_parse_length_dist():
    d = parse_length_dist("bimodal:median=4,median_long=90,frac_long=0.2,max=300")
    assert (d.kind, d.median, d.median_long, d.frac_long, d.max_items) == ("bimodal", 4.0, 90.0, 0.2, 300)
    for bad in (
        "zipf:median=3",
        "lognormal:median",
        "lognormal:depth=3",
        "lognormal:median=x",
        "lognormal:min=5,max=2",
    ):
        with pytest.raises(UserError):
            parse_length_dist(bad)
    with pytest.raises(UserError, match="unknown task"):
        make_prompts("sort", 3)


def test_task_rewards_exact_and_partial():
    assert task_reward("count", "3 4 5 6", "3 4 5 6") == 1.0
    assert task_reward("count", "  3 4\n5 6 ", "3 4 5 6") == 1.0
    assert task_reward("count", "3 4", "3 4 5 6") == 0.5  # stopped early
    assert task_reward("count", "3 4 5 6 7 8 9 10", "3 4 5 6") == 0.5  # ran on
    assert task_reward("count", "3 4 5 6 7 8 9 10", "3 4 5 6", partial=False) == 0.0
    assert task_reward("count", "", "3 4 5 6") == 0.0
    assert task_reward("rle", "aaabbc", "aaabbb") == pytest.approx(5 / 6)
    assert task_reward("addsteps", "1+2+0=3\nsum 3", "1+2+0=3\nsum 3") == 1.0
    assert task_reward("addsteps", "1+2+0=3\nsum 4", "1+2+0=3\nsum 3") == 0.5
    assert compute_reward("asp/count", "1 2", "1 2") == 1.0
    assert reward_fn_for("asp/rle", partial=False)("aab", "aaa") == 0.0


def test_math_reward():
    assert math_reward("so the answer is \\boxed{42}.", "42") == 1.0
    assert math_reward("\\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert math_reward("x = \\boxed{{a}+1}", "{a}+1") == 1.0
    assert math_reward("She pays 1,000 dollars in total: 1000", "#### 1,000") == 1.0
    assert math_reward("Natalia sold 48+24 = 72 clips", "Natalia sold 48/2 = 24 clips.\n#### 72") == 1.0
    assert math_reward("the answer is 71", "72") == 0.0
    assert math_reward("no number here", "72") == 0.0
    assert math_reward("\\boxed{3} then 5", "3") == 1.0  # boxed wins over the last number
    assert math_reward("answer: 7", ["7"]) == 1.0
    assert math_reward("$\\boxed{\\text{B}}$", "b") == 1.0
    assert last_boxed("\\boxed{1") is None and extract_answer("\\boxed{1") == "1"  # truncated: last number
    assert compute_reward("openai/gsm8k", "#### 5", "5") == 1.0
