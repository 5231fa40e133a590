"""The efficiency bound (`asp_npu.sim.limit`): never above a simulated run, and tight where it should be."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asp_npu.sim.cost import SimCost
from asp_npu.sim.limit import limit
from asp_npu.sim.modes import MODES, DeviceSplit
from asp_npu.sim.preset import Cluster, Preset, RLSpec, WorkloadSpec, load_preset
from asp_npu.sim.run import run_modes, simulate_layout
from asp_npu.sim.workload import from_arrays


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 300), min_size=64, max_size=64),
    prompt=st.integers(1, 40),
    decode_c=st.sampled_from([0.0, 1e-5]),
    max_lag=st.integers(0, 3),
)
def test_every_mode_is_at_or_above_its_limit(lengths, prompt, decode_c, max_lag) -> None:
    """Random workloads on the tiny cluster: iteration time / lower bound >= 1 for every mode."""
    p = load_preset("tiny")
    p = replace(p, cost=replace(p.cost, decode_c=decode_c), rl=replace(p.rl, max_lag=max_lag))
    w = from_arrays(np.array(lengths).reshape(16, 4), prompt_len=prompt, prompts_per_iteration=8)
    for m, r in run_modes(p, w, MODES).items():
        assert r.metrics["efficiency"] >= 1.0 - 1e-9, (m, r.metrics["limit"])
        assert r.metrics["efficiency_hardware"] >= r.metrics["efficiency"] - 1e-9, m  # a lower bound


def test_limit_is_tight_on_a_balanced_split() -> None:
    """Equal lengths, one refresh per iteration, a split where rollout and training take equally long:
    the asynchronous pipeline runs both stages flat out; only the first iteration's rollout (the
    pipeline fill) is not overlapped, so the run takes exactly (N + 1) / N of the bound."""
    slots, iters, length = 8, 32, 40
    cost = SimCost(decode_a=0.08, decode_b=0.01, decode_c=0.0, prefill_s_per_token=0.0,
                   train_s_per_token=0.0, refresh_s=0.0, train_dp_devices=1)
    # rollout: per iteration 8 groups x 4 samples x 40 tokens on 1 instance of 8 slots:
    # 4 waves x 40 steps x (0.08 + 0.08) s = 25.6 s; device-seconds per token 0.16/8 = 0.02
    tokens_per_iter = 8 * 4 * (length + 1)
    cost = replace(cost, train_s_per_token=25.6 / tokens_per_iter)  # the trainer (1 device) takes as long
    p = Preset("tight", Cluster(devices=2, infer_tp=1, max_num_seqs=slots, min_trainer_devices=1,
                                sweep_trainer_devices=1, split="rule"),
               WorkloadSpec(prompts_per_iteration=8, n_samples_per_prompt=4, iterations=iters),
               RLSpec(mini_batch_size=32, max_lag=2), cost)
    w = from_arrays(np.full((8 * iters, 4), length), prompt_len=1, prompts_per_iteration=8)
    b = limit(p, w, colocated=False, barrier=False)
    assert b.iteration_s == pytest.approx(25.6)
    r = simulate_layout(p, w, "async-fifo", DeviceSplit(2, 1, 1, 1))
    assert r.metrics["efficiency"] == pytest.approx((iters + 1) / iters)


def test_lag_floor_spreads_the_longest_sample_over_the_lag_bound() -> None:
    """The diagnostic lag floor: the longest sample at batch 1 over `lag + 1` weights versions, per
    version; 0 without a lag or under a rollout barrier, and never part of `iteration_s` / `hardware_s`."""
    p = load_preset("tiny")
    lengths = np.full((16, 4), 10)
    lengths[3, 2] = 200  # one straggler
    w = from_arrays(lengths, prompt_len=5, prompts_per_iteration=8)
    plain = limit(p, w, colocated=False, barrier=False)
    assert plain.lag_floor_s == 0.0
    b = limit(p, w, colocated=False, barrier=False, lag=1, version_groups=4)  # 4 versions, 2 per iteration
    c = p.cost
    kv = c.decode_c * (200 * 5 + 200 * 199 / 2)
    alone = 200 * (c.decode_a + c.decode_b) + kv + c.prefill_s_per_token * 5
    assert b.lag_floor_s == pytest.approx(alone * 4 / 2)
    assert b.lag_floor_iteration_s == pytest.approx(alone * 4 / 2 / w.num_iterations)
    assert (b.work_s, b.longest_s, b.hardware_s) == (plain.work_s, plain.longest_s, plain.hardware_s)
    assert limit(p, w, colocated=False, barrier=True, lag=0, version_groups=8).lag_floor_s == 0.0


def test_a_lag_bounded_run_reports_its_lag_floor() -> None:
    """`simulate_layout` passes the mode's lag (partial rollout: the token-lag bound) to the floor."""
    p = load_preset("tiny")
    w = from_arrays(np.array([[10, 10, 10, 300]] * 16), prompt_len=5, prompts_per_iteration=8)
    lay = DeviceSplit(p.cluster.devices, 1, p.cluster.infer_tp, p.cluster.devices - p.cluster.infer_tp)
    r = simulate_layout(p, w, "async-fifo", lay)
    pr = simulate_layout(replace(p, rl=replace(p.rl, partial_rollout=True)), w, "async-fifo", lay)
    f, fp = r.metrics["limit"]["lag_floor_iteration_s"], pr.metrics["limit"]["lag_floor_iteration_s"]
    assert f > 0 and fp > 0
    lag, token_lag = r.result.spec.max_lag, pr.result.spec.max_token_lag
    assert fp * (token_lag + 1) == pytest.approx(f * (lag + 1))
    assert r.metrics["iteration_time_mean_s"] >= f  # a schedule respecting the lag cannot beat it here


def test_trainer_shapes_give_only_legal_trainers_and_charge_their_pipeline() -> None:
    """`cluster.trainer_shapes`: every candidate trainer is DP copies of a listed TP x PP shape with DP
    dividing the step's micro-batches; a pipeline pays stage imbalance x 1F1B bubble, in the run's cost
    and in the split bound alike; without shapes the candidates are the old whole DP ranks."""
    from asp_npu.sim.modes import candidate_splits, pipeline_factor, trainer_cost
    from asp_npu.sim.preset import validate

    base = load_preset("paper")
    assert base.cluster.trainer_shapes  # the preset lists its checked shapes
    for lay in candidate_splits(base, 20):
        size = lay.trainer_tp * lay.trainer_pp
        assert f"{lay.trainer_tp}x{lay.trainer_pp}" in base.cluster.trainer_shapes
        assert lay.trainer_devices % size == 0 and 256 % (lay.trainer_devices // size) == 0
    assert [lay.trainer_devices for lay in candidate_splits(base, 20)] == [18, 16, 14, 12, 10, 8]
    # 28 layers over PP3: stages of 10, 9, 9 -> 10 / (28 / 3); 256 micro-batches: bubble (256 + 2) / 256
    assert pipeline_factor(base, 4, 3, 1) == pytest.approx(10 / (28 / 3) * 258 / 256)
    assert pipeline_factor(base, 2, 7, 2) == pytest.approx(1 * (128 + 6) / 128)
    assert pipeline_factor(base, 4, 1, 4) == 1.0
    lay = DeviceSplit(20, 4, 2, 12, 4, 3)
    c = trainer_cost(base, base.cost, lay)
    assert c.train_dp_devices == 12 and c.train_s_per_token == pytest.approx(
        base.cost.train_s_per_token * pipeline_factor(base, 4, 3, 1))
    old = replace(base, cluster=replace(base.cluster, trainer_shapes=None))
    assert [lay.trainer_devices for lay in candidate_splits(old, 20)] == [16, 12, 8]
    assert all(lay.trainer_tp == 0 for lay in candidate_splits(old, 20))
    bad = replace(base, cluster=replace(base.cluster, trainer_shapes=["4x"]))
    assert any("trainer_shapes: '4x'" in b for b in validate(bad))
    bad = replace(base, cluster=replace(base.cluster, trainer_layers=0))
    assert any("trainer_layers" in b for b in validate(bad))
