"""GAE against a hand computation, and per-token advantages / loss masks reaching the loss tensors."""

from __future__ import annotations

import numpy as np
import pytest

from asp_npu.trainer.advantages import gae, whiten
from asp_npu.trainer.batching import Sample, make_micro_batches


def test_gae_equals_the_hand_computation() -> None:
    # rewards only at the last token, gamma 0.9, lambda 0.5, values 0.2 0.4 0.6
    adv, ret = gae([0.0, 0.0, 1.0], [0.2, 0.4, 0.6], gamma=0.9, lam=0.5)
    d2 = 1.0 - 0.6                      # last token: no next value
    d1 = 0.0 + 0.9 * 0.6 - 0.4
    d0 = 0.0 + 0.9 * 0.4 - 0.2
    a2 = d2
    a1 = d1 + 0.45 * a2
    a0 = d0 + 0.45 * a1
    assert adv == pytest.approx([a0, a1, a2])
    assert ret == pytest.approx([a0 + 0.2, a1 + 0.4, a2 + 0.6])


def test_gae_with_gamma_and_lambda_one_is_the_return_minus_the_value() -> None:
    adv, ret = gae([0.5, 0.0, 2.0], [1.0, -1.0, 0.5], gamma=1.0, lam=1.0)
    assert ret == pytest.approx([2.5, 2.0, 2.0])
    assert adv == pytest.approx([1.5, 3.0, 1.5])


def test_gae_refuses_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="one of each per response token"):
        gae([0.0, 1.0], [0.0])


def test_whiten_is_batch_wide() -> None:
    rows = whiten([np.array([1.0, 2.0]), np.array([3.0])])
    flat = np.concatenate(rows)
    assert flat.mean() == pytest.approx(0.0)
    assert flat.std(ddof=1) == pytest.approx(1.0, rel=1e-6)


def test_per_token_advantages_and_loss_masks_reach_the_micro_batch() -> None:
    s = Sample(0, [1, 2, 3, 4, 5, 6], 2, [0.1, 0.2, 0.3, 0.4], [0.0] * 4, loss_mask=[1, 0, 0, 1])
    mb = make_micro_batches([s], 1)[0]
    assert mb["mask"][0, 1:5].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert mb["adv"][0, 1:5].tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert int(mb["resp_len"][0]) == 2  # only the model's own tokens count for the aggregation


def test_a_per_token_advantage_of_the_wrong_length_is_refused() -> None:
    s = Sample(0, [1, 2, 3, 4], 2, [0.1], [0.0] * 2)
    with pytest.raises(ValueError, match="1 per-token values for 2 response tokens"):
        make_micro_batches([s], 1)
