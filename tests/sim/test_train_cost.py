"""The simulator's trainer cost follows packing: real tokens packed, padded slots unpacked (the slots
asp-npu's length-sorted micro-batches compute, `trainer/batching.py`)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from asp_npu.sim.cost import SimCost, train_seconds


def _cost(**kw: object) -> SimCost:
    return SimCost(train_s_per_token=1.0, train_step_s=0.0, **kw)  # type: ignore[arg-type]


def test_packed_charges_real_tokens_unpacked_the_padded_slots():
    lens = np.array([10, 2, 2, 1])
    assert train_seconds(_cost(), lens, 1, False) == (15.0, 1.0)
    # micro-batches [10, 2] and [2, 1], each padded to its longest: 20 + 4 slots for 15 real tokens
    secs, useful = train_seconds(_cost(train_packed=False, micro_batch_size=2), lens, 1, False)
    assert secs == 24.0 and useful == pytest.approx(15 / 24)
    # use_dynamic_bsz, 12 padded tokens: [10] alone, then [2, 2, 1] in one (3 x 2 <= 12)
    assert train_seconds(_cost(train_packed=False, train_max_token_len=12), lens, 1, False)[0] == 16.0
    # two ranks: 10 | 2, 2, 1 (longest first to the rank with fewer real tokens); the first sets the time
    assert train_seconds(_cost(train_packed=False, micro_batch_size=2), lens, 2, False)[0] == 10.0
    # MindSpeed-RL's data-order padded trainer is unchanged by the flag
    assert train_seconds(_cost(train_packed=False, micro_batch_size=2), lens, 1, True) == \
        train_seconds(_cost(micro_batch_size=2), lens, 1, True)


@pytest.mark.parametrize("budget", [0, 300])
def test_unpacked_slots_equal_the_real_trainers_micro_batches(budget):
    from asp_npu.trainer.batching import micro_batch_bounds

    rng = random.Random(budget)
    for _ in range(20):
        lens = sorted((int(min(512, rng.lognormvariate(4.2, 1.2))) + 1 for _ in range(rng.randint(1, 40))),
                      reverse=True)
        start, slots = 0, 0
        for end in micro_batch_bounds(lens, 4, budget):
            slots += lens[start] * (end - start)
            start = end
        got = train_seconds(_cost(train_packed=False, micro_batch_size=4, train_max_token_len=budget),
                            np.array(lens), 1, False)[0]
        assert got == slots
