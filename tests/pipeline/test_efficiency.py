"""A real run against its limit (`x limit`, MFU) and a calibration's spread and noise verdict: the pure
computations, on hand-made measurements (no engine)."""

from __future__ import annotations

import pytest

from asp_npu.arch import ModelDims
from asp_npu.pipeline import efficiency as eff
from asp_npu.pipeline.machine_load import foreign_share, summarise
from asp_npu.sim.calibrate import decode_corners, figure_spreads, spread, step_s, verdict


def _batch(t0: float, n: int, r: int, a: float, b: float, tag: str) -> tuple[list[dict], float]:
    """`n` sequences of `r` tokens started together at `t0`, decoding at a + b n seconds a step."""
    end = t0 + r * (a + b * n)
    ev = [{"event": "start", "t": t0, "prompt_id": f"{tag}{k}", "sample_idx": 0} for k in range(n)]
    ev += [{"event": "finish", "t": end, "prompt_id": f"{tag}{k}", "sample_idx": 0, "tokens": r}
           for k in range(n)]
    return ev, end


def test_decode_fit_recovers_the_step_cost_from_sequence_events():
    a, b = 0.006, 0.0004
    events, t = [], 0.0
    for n, r in ((1, 30), (4, 20), (8, 12), (16, 7)):
        ev, t = _batch(t + 0.5, n, r, a, b, f"n{n}-")
        events += ev
    fit = eff.decode_fit([events[::-1]])  # order does not matter
    assert fit is not None and fit["sequences"] == 29
    assert fit["a"] == pytest.approx(a, rel=1e-6) and fit["b"] == pytest.approx(b, rel=1e-6)
    # one batch size only: a and b cannot be told apart, one non-negative term carries it all
    ev, _ = _batch(0.0, 4, 10, a, b, "x")
    one = eff.decode_fit([ev, []])
    assert one is not None and one["a"] >= 0 and one["b"] >= 0
    assert one["a"] * 10 + one["b"] * 40 == pytest.approx(10 * (a + 4 * b))
    assert eff.decode_fit([ev[:1]]) is None  # nothing finished
    # 16 submitted at once into 8 slots: two rounds of 8; each sequence lives both rounds (it waits)
    ev, t = _batch(0.0, 16, 10, 2 * a, b, "q")  # lifetime = 10 (2a + 16b) = 2 x 10 (a + 8 b)
    ev2, _ = _batch(t + 1, 2, 10, a, b, "r")
    two = eff.decode_fit([ev + ev2], slots=8)
    assert two is not None and two["a"] == pytest.approx(a, rel=1e-6)
    assert two["b"] == pytest.approx(b, rel=1e-6)


def test_decode_fit_leaves_out_the_warm_up_and_the_refresh_freezes():
    """The engines' warm-up (seconds of one-off set-up before the clock) and the windows in which a
    weight_refresh froze running sequences are not decode steps: with them counted, a run of
    0.017 s/step fitted 0.146 s/step and its bound sat 6x above the run."""
    from asp_npu.pipeline.queue_actor import WARMUP_PREFIX

    a = 0.017

    def step(fit: dict | None) -> float:  # one batch size (8): only a + 8 b is determined
        assert fit is not None
        return fit["a"] + 8 * fit["b"]

    events, t = [], 0.0
    for k in range(6):
        ev, t = _batch(t + 0.1, 8, 24, a, 0.0, f"g{k}-")
        events += ev
    clean = eff.decode_fit([events])
    assert step(clean) == pytest.approx(a, rel=1e-6)
    pid = f"{WARMUP_PREFIX}0@0"
    warm = [{"event": "start", "t": -40.0, "prompt_id": pid, "sample_idx": k} for k in range(4)]
    warm += [{"event": "finish", "t": -0.5, "prompt_id": pid, "sample_idx": k, "tokens": 24}
             for k in range(4)]
    with_warm = eff.decode_fit([warm + events])
    assert step(with_warm) == pytest.approx(a, rel=1e-6)
    assert with_warm is not None and clean is not None and with_warm["sequences"] == clean["sequences"] == 48
    # every batch frozen 0.2 s mid-flight: lifetimes longer by 0.2 s, the fit unchanged once cut out
    frozen_events, windows, t = [], [], 0.0
    for k in range(6):
        ev, end = _batch(t + 0.1, 8, 24, a, 0.0, f"f{k}-")
        for e in ev:
            if e["event"] == "finish":
                e["t"] += 0.2
        windows.append((t + 0.2, t + 0.4))
        frozen_events += ev
        t = end + 0.2
    assert step(eff.decode_fit([frozen_events])) > 1.3 * a
    cut = eff.decode_fit([frozen_events], frozen=[windows + windows[:1]])  # a repeated window counts once
    assert step(cut) == pytest.approx(a, rel=1e-6)


def test_against_limit_is_the_simulators_bound_on_the_runs_own_costs():
    """mindspeed-sync (colocated, a rollout barrier) on 1 core: bound = max((W_t + W_r) / D, longest
    per iteration summed), by hand."""
    raw = {"rl_config": {"mode": "mindspeed-sync", "n_samples_per_prompt": 2, "mini_batch_size": 2,
                         "global_batch_size": 1},
           "generate_config": {"num_instances": 1, "max_num_seqs": 2}, "trainer": {"train_iters": 2}}
    rows = [{"prompt_id": p, "epoch": 0, "sample_idx": k, "response_len": n, "prompt_len": 4}
            for p, lens in (("g0", (3, 5)), ("g1", (2, 2))) for k, n in enumerate(lens)]
    out = eff.against_limit(raw, rows, [1.0, 1.0], {"a": 0.1, "b": 0.01, "sequences": 4}, 2.0, 2, cores=1)
    # W_t = 2 s (the run's update time); W_r = 12 tokens x (0.1 / 2 + 0.01); longest: (5 + 2) x 0.11
    w = 2.0 + 12 * 0.06
    assert out["limit_iteration_s"] == pytest.approx(max(w, 7 * 0.11) / 2)
    assert out["x_limit"] == pytest.approx(2.0 / (w / 2))
    assert out["train_s_per_token"] == pytest.approx(2.0 / 28) and out["layout"]["trainer_devices"] == 1


def test_mfu_counts_6n_plus_causal_attention():
    dims = ModelDims(hidden_size=64, intermediate_size=128, num_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=100, rms_norm_eps=1e-6, rope_theta=1e4,
                     max_position_embeddings=128, tie_word_embeddings=True)
    attn = 64 * 64 + 2 * 64 * 32 + 64 * 64
    assert dims.matmul_params == 2 * (attn + 3 * 64 * 128) + 64 * 100
    flops = dims.train_flops([3, 1])
    assert flops == 6 * dims.matmul_params * 4 + 12 * 2 * 4 * 16 * (6 + 1)
    assert eff.mfu(flops, 2.0, 4, flops / 16) == pytest.approx(2.0)
    assert eff.mfu(flops, 2.0, 4, None) is None


def test_spread_and_the_noise_verdict():
    s = spread([1.0, 1.02, 0.99])
    assert s["median"] == 1.0 and s["rel"] == pytest.approx(0.03) and s["n"] == 3
    assert spread([0.0, 0.0])["rel"] == 0.0 and spread([0.0, 0.0, 1e-9])["rel"] == float("inf")
    quiet = {"decode_a": spread([1.0, 1.01, 1.02]), "refresh_s": spread([0.5, 0.51, 0.5])}
    ok = verdict(quiet, 0.02, 0.4)
    assert ok["trusted"] and "trusted" in ok["line"] and "\n" not in ok["line"]
    noisy = {**quiet, "trainer_s_per_token": spread([1.0, 1.2, 1.0])}
    bad = verdict(noisy, 0.02, 0.4)
    assert not bad["trusted"] and "trainer_s_per_token 20%" in bad["line"]
    busy = verdict(quiet, 0.3, 6.5)
    assert not busy["trusted"] and "30% of the cores" in busy["line"] and "6.5" in busy["line"]
    assert verdict(quiet, 0.3, max_foreign=0.5)["trusted"]


def test_figure_spreads_fit_each_repeat():
    a, b = 0.004, 0.0003
    decode = [{"batch": n, "prompt_len": 16, "kv_tokens": 0.0, "step_s": a + b * n,
               "step_s_runs": [a + b * n, (a + b * n) * 1.1, a + b * n]} for n in (1, 4, 16)]
    prefill = [{"prompt_tokens": p, "ttft_s": 1e-4 * p, "ttft_s_runs": [1e-4 * p] * 3} for p in (32, 128)]
    got = figure_spreads({"decode": decode, "prefill": prefill,
                          "refresh": [{"total_s": 1.0}, {"total_s": 1.5}],
                          "matmul_flops_per_s": [1e9, 1.01e9, 0.99e9]})
    assert got["decode_a"]["n"] == 3 and got["decode_a"]["rel"] == pytest.approx(0.1, rel=1e-6)
    assert got["decode_b_per_seq"]["max"] == pytest.approx(b * 1.1)
    assert got["prefill_s_per_token"]["rel"] == pytest.approx(0.0, abs=1e-9)
    assert got["refresh_s"]["rel"] == pytest.approx(0.4)
    assert got["matmul_flops_per_s"]["rel"] == pytest.approx(0.02)


def test_the_decode_fit_is_judged_at_its_corners_not_by_its_coefficients():
    """b (per sequence) and c (per KV token) trade off when KV grows with the batch: two repeats with the
    same step times at every point but different coefficients are trusted; a repeat whose batch-16 step
    moves by 10% is not."""
    a = 0.004
    pts = [(1, 100.0), (4, 400.0), (16, 1600.0)]  # KV tokens = 100 x batch: b n and c kv are one column
    step = {n: a + 0.0003 * n for n, _ in pts}
    decode = [{"batch": n, "prompt_len": 16, "kv_tokens": kv, "step_s": step[n],
               "step_s_runs": [step[n]] * 2} for n, kv in pts]
    rep = [{"decode_step_s": {"a": a, "b_per_seq": 0.0003, "c_per_kv_token": 0.0}},
           {"decode_step_s": {"a": a, "b_per_seq": 0.0, "c_per_kv_token": 0.000003}}]
    assert decode_corners(decode) == {"decode_step_at_batch_1": (1, 100.0),
                                      "decode_step_at_batch_16": (16, 1600.0)}
    for n, kv in pts:
        assert step_s(rep[0]["decode_step_s"], n, kv) == pytest.approx(step_s(rep[1]["decode_step_s"], n, kv))
    same = {"decode_b_per_seq": spread([0.0003, 0.0]), "decode_c_per_kv_token": spread([0.0, 3e-6]),
            "decode_step_at_batch_1": spread([step[1]] * 2),
            "decode_step_at_batch_16": spread([step[16]] * 2)}
    assert verdict(same, 0.02)["trusted"]
    moved = {**same, "decode_step_at_batch_16": spread([step[16], step[16] * 1.1])}
    assert "decode_step_at_batch_16 10%" in verdict(moved, 0.02)["line"]
    assert not verdict({"decode_b_per_seq": spread([0.0003, 0.0])}, 0.02)["trusted"]  # no corners: judged
    drift = verdict({**same, "matmul_flops_per_s": spread([9.7e10, 8.4e10, 1.05e11])}, 0.02)["line"]
    assert "NOT trusted" in drift and "speed moved 22%" in drift and "figure(s)" not in drift
    drawn = {**decode[0], "step_s_runs": [step[1], step[1]]}
    got = figure_spreads({"decode": [drawn, *decode[1:]], "prefill": [], "refresh": []})
    assert got["decode_step_at_batch_16"]["n"] == 2 and got["decode_step_at_batch_1"]["rel"] < 1e-9


def test_foreign_load_share():
    before = {1: (10.0, 0.0), 2: (5.0, 0.0)}
    after = {1: (11.0, 0.0), 2: (5.5, 0.0), 3: (0.5, 100.5), 4: (900.0, 50.0)}
    # pid 3 started in between (counts whole), pid 4 is old but was not read before (not counted)
    assert foreign_share(before, after, 100.0, 2.0, 2) == pytest.approx(0.5)
    assert foreign_share(before, {1: (9.0, 0.0)}, 100.0, 1.0, 2) == 0.0  # never negative
    got = summarise([(0.0, 0.1, 1.0), (0.5, 0.3, 2.5)])
    assert got["mean"] == pytest.approx(0.2) and got["max"] == 0.3 and got["loadavg_1m_max"] == 2.5
