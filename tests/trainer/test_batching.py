"""How a TrainBatch becomes per-rank micro-batches: every response token exactly once, whatever the layout."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.trainer.batching import batch_to_samples, make_micro_batches, shard_for_dp
from asp_npu.types import TrainBatch, Trajectory


def _batch(lengths: list[tuple[int, int]], group_size: int) -> TrainBatch:
    trajs = [Trajectory(f"p{i // group_size}", i % group_size, list(range(1, p + 1)), list(range(1, r + 1)),
                        [-1.0] * r, "stop", float(i % 2), 0) for i, (p, r) in enumerate(lengths)]
    return TrainBatch(trajs, group_size)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 4), st.integers(1, 6), st.data())
def test_every_response_token_lands_once_on_some_rank(group_size, groups, dp, mbs, data):
    lengths = data.draw(st.lists(st.tuples(st.integers(1, 9), st.integers(1, 12)),
                                 min_size=group_size * groups, max_size=group_size * groups))
    samples, dropped = batch_to_samples(_batch(lengths, group_size), drop_equal_groups=False)
    assert dropped == 0 and len(samples) == len(lengths)
    seen, tokens = [], 0
    for rank in range(dp):
        for mb in make_micro_batches(shard_for_dp(samples, dp, rank), mbs):
            assert mb["input_ids"].shape[0] <= mbs
            seen += mb["index"].tolist()
            tokens += int(mb["mask"].sum())
            assert mb["mask"].shape == mb["labels"].shape == mb["behav"].shape
    assert sorted(seen) == list(range(len(lengths)))
    assert tokens == sum(r for _, r in lengths)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9), st.integers(1, 60)), min_size=1, max_size=40),
       st.integers(8, 200))
def test_dynamic_bsz_packs_every_sample_once_within_the_token_budget(lengths, budget):
    samples, _ = batch_to_samples(_batch(lengths, 1), drop_equal_groups=False)
    micro = make_micro_batches(samples, micro_batch_size=1, max_token_len=budget)
    seen = [i for mb in micro for i in mb["index"].tolist()]
    assert sorted(seen) == list(range(len(lengths)))
    for mb in micro:
        b, seq = mb["input_ids"].shape
        assert b * seq <= budget or b == 1  # a sample longer than the budget goes alone
    assert sum(int(mb["mask"].sum()) for mb in micro) == sum(r for _, r in lengths)


def test_dynamic_bsz_does_not_pad_a_long_tailed_minibatch_to_its_longest_sample():
    lengths = [(4, 96)] + [(4, 8)] * 15  # one straggler among short answers
    samples, _ = batch_to_samples(_batch(lengths, 1), drop_equal_groups=False)
    fixed = make_micro_batches(samples, micro_batch_size=16)
    dynamic = make_micro_batches(samples, micro_batch_size=16, max_token_len=256)
    assert [mb["input_ids"].shape[0] for mb in dynamic] == [2, 14]
    assert sum(mb["input_ids"].numel() for mb in dynamic) * 4 < sum(mb["input_ids"].numel() for mb in fixed)


def test_labels_are_the_next_token_on_response_positions():
    samples, _ = batch_to_samples(_batch([(3, 2)], 1), drop_equal_groups=False)
    mb = make_micro_batches(samples, 4)[0]
    # tokens = [1, 2, 3 | 1, 2]: inputs drop the last token, labels drop the first
    assert mb["input_ids"][0].tolist() == [1, 2, 3, 1]
    assert mb["labels"][0].tolist() == [2, 3, 1, 2]
    assert mb["mask"][0].tolist() == [0, 0, 1, 1]


def test_incomplete_groups_and_missing_logprobs_are_rejected():
    with pytest.raises(ValueError, match="incomplete group"):
        batch_to_samples(_batch([(2, 2)] * 3, 2), drop_equal_groups=False)
    bad = _batch([(2, 2)] * 2, 2)
    bad.trajectories[1].logprobs = [-1.0]
    with pytest.raises(ValueError, match="1 logprobs for 2 response tokens"):
        batch_to_samples(bad, drop_equal_groups=False)


def test_equal_reward_groups_are_dropped_on_request():
    b = _batch([(2, 3)] * 4, 2)
    for t in b.trajectories[:2]:
        t.reward = 1.0
    samples, dropped = batch_to_samples(b, drop_equal_groups=True)
    assert dropped == 1 and sorted(s.index for s in samples) == [2, 3]
