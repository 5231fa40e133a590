"""Predictors: online vs columnar updates, cold-start fallback, quantiles, drift, evaluation, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.cli import main as cli_main
from asp_npu.data.traces import SynthParams, synth_trace, write_trace
from asp_npu.predict.base import Predictor, grouped_quantiles
from asp_npu.predict.coldstart import PRIOR_MEDIAN, PromptLenPredictor
from asp_npu.predict.evaluate import evaluate
from asp_npu.predict.factory import make_predictor
from asp_npu.predict.history import HistoryPredictor
from asp_npu.predict.oracle import OraclePredictor


@pytest.fixture(scope="module")
def trace():
    return synth_trace(SynthParams(prompts=500, epochs=3, n=8, seed=11))


def test_factory_and_protocol() -> None:
    for name in ("history", "prompt-len", "oracle"):
        p = make_predictor(name)
        assert isinstance(p, Predictor) and p.name == name
    with pytest.raises(ValueError, match="unknown predictor"):
        make_predictor("magic")


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(1, 10_000), st.floats(0.1, 5.0)), min_size=1, max_size=60
    )
)
def test_grouped_quantiles_match_a_direct_computation(rows) -> None:
    codes = np.array([r[0] for r in rows])
    vals = np.array([float(r[1]) for r in rows])
    w = np.array([r[2] for r in rows])
    mean, (q50, q90) = grouped_quantiles(codes, vals, w, 5, (0.5, 0.9))
    for g in range(5):
        sel = codes == g
        if not sel.any():
            assert np.isnan(mean[g]) and np.isnan(q90[g])
            continue
        assert mean[g] == pytest.approx(np.average(vals[sel], weights=w[sel]))
        order = np.argsort(vals[sel], kind="stable")
        share = np.cumsum(w[sel][order]) / w[sel].sum()
        for q, got in ((0.5, q50[g]), (0.9, q90[g])):
            expect = vals[sel][order][np.searchsorted(share, q * 0.999999 - 1e-12)]
            assert got == expect


def test_history_online_equals_columnar(trace) -> None:
    hist = trace.before(2)
    ids = hist.prompt_names[hist.prompt_code]
    a, b = HistoryPredictor(), HistoryPredictor()
    a.observe_many(ids, hist.epoch, hist.response_len, hist.prompt_len)
    for i in range(len(hist)):
        b.observe(str(ids[i]), int(hist.epoch[i]), int(hist.response_len[i]), int(hist.prompt_len[i]))
    q = trace.prompt_names[:50]
    ea, eb = a.predict_many(q, np.full(50, 100)), b.predict_many(q, np.full(50, 100))
    assert np.allclose(ea.mean, eb.mean) and np.allclose(ea.q90, eb.q90)
    assert set(ea.source.tolist()) == {"history"}
    assert np.all(ea.q50 <= ea.q90)


def test_history_falls_back_to_cold_start_for_unseen_prompts() -> None:
    h = HistoryPredictor()
    h.observe("seen", 0, 1000, 50)
    est = h.predict("never-seen", 50)
    assert est.source in ("prompt-len", "population")
    assert h.predict("seen", 50).source == "history" and h.predict("seen", 50).mean == pytest.approx(1000)


def test_history_follows_the_recent_epoch_and_drift() -> None:
    h = HistoryPredictor(decay=0.5, drift_correction=False)
    h.observe_many(["p"] * 4, [0, 0, 1, 1], [100, 100, 400, 400])
    assert h.predict("p", 10).mean == pytest.approx((100 * 0.5 * 2 + 400 * 2) / 3)
    # population-wide growth of +20%/epoch is extrapolated one epoch ahead
    rng = np.random.default_rng(0)
    base = rng.lognormal(7, 0.5, 50)
    ids = np.repeat([f"q{i}" for i in range(50)], 2)
    d = HistoryPredictor(decay=1e-9)
    d.observe_many(ids, np.tile([0, 1], 50), np.stack([base, base * 1.2], 1).ravel())
    est = d.predict_many(np.array(["q0", "q1"]), np.array([1, 1]))
    assert d.drift == pytest.approx(np.log(1.2), abs=1e-6)
    assert est.mean[0] == pytest.approx(base[0] * 1.44, rel=1e-3)


def test_cold_start_prior_and_prompt_length_signal() -> None:
    c = PromptLenPredictor()
    assert c.predict("x", 100).q50 == pytest.approx(PRIOR_MEDIAN)
    rng = np.random.default_rng(1)
    pl = rng.integers(20, 2000, 400)
    resp = np.maximum(1, (pl * 5 * rng.lognormal(0, 0.3, 400))).astype(int)
    c.observe_many([f"p{i}" for i in range(400)], 0, resp, pl)
    short, long_ = c.predict("a", 30), c.predict("b", 1500)
    assert short.source == "prompt-len" and short.mean < long_.mean
    assert long_.q50 < long_.q90


def test_oracle_is_exact_for_revealed_prompts() -> None:
    o = OraclePredictor()
    o.reveal(["a", "a", "a", "b"], [10, 20, 30, 7])
    e = o.predict("a", 5)
    assert (e.mean, e.q50, e.source) == (20, 20, "oracle")
    assert o.predict("zzz", 5).source == "population"


def test_evaluate_history_vs_oracle(trace) -> None:
    h = evaluate(trace, 2, "history")
    o = evaluate(trace, 2, "oracle")
    cold = evaluate(trace, 0, "history")
    assert o["spearman"] == 1.0 and h["spearman"] > 0.7 and h["from_history"] == 1.0
    assert 0.75 < h["coverage_q90"] <= 1.0 and h["mae"] > o["mae"] * 0.9
    assert cold["spearman"] is None and cold["from_history"] == 0.0


def test_predict_eval_cli(tmp_path, trace, capsys) -> None:
    path = write_trace(trace, tmp_path / "t.jsonl")
    assert cli_main(["predict-eval", "--trace", str(path), "--epoch", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"spearman", "mae", "coverage_q90"} <= set(out)
    assert cli_main(["predict-eval", "--trace", str(path), "--epoch", "7"]) == 2
    assert cli_main(["predict-eval", "--trace", str(path), "--epoch", "1", "--predictor", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "epoch 7 is not in the trace" in err[0]
