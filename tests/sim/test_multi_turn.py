"""Multi-turn (tool-calling) trajectories in the simulator (issue 29): the generator, the engine's
turns and tool waits, the lag bound across turns, the limit, determinism, `bench sim` presets."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asp_npu.cli import main as cli_main
from asp_npu.data.traces import MultiTurnParams, Turns, synth_multiturn
from asp_npu.errors import UserError
from asp_npu.sim.cost import SimCost
from asp_npu.sim.engine import RunSpec, Simulation
from asp_npu.sim.modes import partial_allowed, pull_source
from asp_npu.sim.preset import load_preset
from asp_npu.sim.run import build_workload, simulate, work_source
from asp_npu.sim.workload import from_arrays, from_trace, with_turns

MODES = ["asp", "async-fifo", "sortedrl", "mindspeed-sync", "one-step-off"]
TINY_MT = {"prompts": 24, "epochs": 2, "turn_median": 12.0, "max_len": 200, "prompt_median": 8.0,
           "tool_median_s": 0.3, "tail_scale_s": 1.0, "tool_timeout_s": 4.0, "tool_tokens_median": 6.0}


def turns_of(rows: list[list[tuple[int, int, float]]]) -> Turns:
    """Turns from per-sample lists of (model tokens, tool tokens, tool seconds); the last turn's
    tool part is ignored (no tool call after the answer)."""
    counts = [len(r) for r in rows]
    off = np.r_[0, np.cumsum(counts)].astype(np.int64)
    flat = [(m, t if k < len(r) - 1 else 0, s if k < len(r) - 1 else 0.0)
            for r in rows for k, (m, t, s) in enumerate(r)]
    m, t, s = zip(*flat, strict=True)
    return Turns(off, np.array(m, dtype=np.int64), np.array(t, dtype=np.int64), np.array(s, dtype=np.float64))


def tiny_mt(**over) -> tuple:
    p = load_preset("tiny", overrides={"workload.synth": {}, "workload.multi_turn": {**TINY_MT, **over}})
    return p, build_workload(p)


# ------------------------------------------------------------------------------------------ generator


@pytest.mark.parametrize("shape", ["geometric", "bimodal"])
def test_generator_rows_are_consistent_and_capped(shape) -> None:
    p = MultiTurnParams(prompts=200, epochs=3, n=4, shape=shape, max_len=3000, max_turns=10, seed=3)
    t = synth_multiturn(p)
    tr = t.turns
    assert tr is not None and len(tr) == len(t) == 200 * 3 * 4
    assert np.array_equal(tr.per_row(tr.model), t.response_len)
    assert t.response_len.max() <= 3000 and tr.model.min() >= 1
    assert tr.counts.min() >= 1 and tr.counts.max() <= 10
    last = tr.offsets[1:] - 1
    assert np.all(tr.tool_tokens[last] == 0) and np.all(tr.tool_s[last] == 0.0)
    inner = np.ones(tr.model.size, dtype=bool)
    inner[last] = False
    assert np.all(tr.tool_tokens[inner] >= 1) and np.all(tr.tool_tokens[inner] <= p.tool_tokens_cap)
    assert np.all(tr.tool_s[inner] > 0) and tr.tool_s.max() <= p.tool_timeout_s
    again = synth_multiturn(p)
    assert np.array_equal(again.turns.model, tr.model) and np.array_equal(again.turns.tool_s, tr.tool_s)
    sub = t.select(t.epoch == 1)
    assert np.array_equal(sub.turns.per_row(sub.turns.model), sub.response_len)


def test_bimodal_turn_counts_have_two_modes_and_persist_per_prompt() -> None:
    t = synth_multiturn(MultiTurnParams(prompts=400, epochs=2, n=8, shape="bimodal", seed=1))
    c = t.turns.counts
    assert 0.35 < np.mean(c == 1) < 0.65 and np.mean(c == 2) < 0.02 and np.median(c[c > 1]) >= 6
    # a prompt's share of direct answers persists from one epoch to the next
    share = (c == 1).reshape(2, 400, 8).mean(axis=2)
    assert np.corrcoef(share[0], share[1])[0, 1] > 0.5


def test_multi_turn_preset_refuses_mixed_or_unknown_knobs() -> None:
    with pytest.raises(UserError, match="multi_turn"):
        load_preset("tiny", overrides={"workload.multi_turn": {"prompts": 8}})  # tiny has synth
    with pytest.raises(UserError, match="unknown key 'bogus'"):
        load_preset("tiny", overrides={"workload.synth": {}, "workload.multi_turn": {"bogus": 1}})
    with pytest.raises(UserError, match="geometric"):
        load_preset("tiny", overrides={"workload.synth": {}, "workload.multi_turn": {"shape": "x"}})


# ---------------------------------------------------------------------------------------------- engine


def test_tool_wait_frees_the_slot_for_another_sample() -> None:
    """1 instance, 1 slot: sample A decodes 2 tokens, calls a 10 s tool, then decodes 2 more; sample B
    (4 tokens) takes the slot during A's wait, so the rollout ends at 2 + 4 = 6 steps... plus A's
    second turn after the wait (t = 12 + 2)."""
    cost = SimCost(decode_a=1.0, decode_b=0.0, train_s_per_token=1e-6, refresh_s=0.0)
    w = with_turns(from_arrays(np.ones((1, 2), dtype=np.int64)),
                   turns_of([[(2, 5, 10.0), (2, 0, 0.0)], [(4, 0, 0.0)]]))
    spec = RunSpec(mode="t", colocated=False, instances=1, slots=1, instance_devices=1, trainer_devices=1,
                   minibatch_groups=1, version_groups=1, max_lag=1, devices=2)
    sim = Simulation(spec, w, cost, pull_source(w))
    sim.audit = []
    res = sim.run()
    ev = [(t, what, s) for t, what, s, _ in sim.audit]
    assert ev == [(0.0, "start", 0), (2.0, "leave", 0), (2.0, "start", 1), (6.0, "leave", 1),
                  (12.0, "tool_done", 0), (12.0, "start", 0), (14.0, "leave", 0)]
    assert res.tokens_generated == 8
    assert res.iteration_ends[0] == pytest.approx(14.0, abs=1e-3)


turn = st.tuples(st.integers(1, 40), st.integers(0, 30), st.floats(0.0, 3.0, allow_nan=False))
trajectory = st.lists(turn, min_size=1, max_size=4)


def _audit_invariants(sim: Simulation, w, slots: int) -> None:
    """Per sample: start, leave, (tool_done, start, leave)* with the tool's latency between leave and
    tool_done and no slot held in between; per instance at most `slots` held at once."""
    tr = w.turns
    per: dict[int, list[tuple[float, str, int]]] = defaultdict(list)
    held: dict[int, int] = defaultdict(int)
    for t, what, s, i in sim.audit:
        per[s].append((t, what, i))
        if what in ("start", "leave"):
            held[i] += 1 if what == "start" else -1
            assert 0 <= held[i] <= slots
    for s in range(w.response_len.size):
        evs = per[s]
        k = int(tr.counts[s])
        assert [e[1] for e in evs] == ["start", "leave"] + ["tool_done", "start", "leave"] * (k - 1)
        assert len({e[2] for e in evs}) == 1  # a trajectory stays on its instance (its prefix cache)
        for j in range(k - 1):
            leave, done, start = evs[1 + 3 * j], evs[2 + 3 * j], evs[3 + 3 * j]
            assert done[0] - leave[0] == pytest.approx(float(tr.tool_s[tr.offsets[s] + j]), abs=1e-9)
            assert start[0] >= done[0] - 1e-9  # no slot before the tool answered


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(trajectory, min_size=32, max_size=32), max_lag=st.integers(1, 3),
       partial=st.booleans(), mode=st.sampled_from(MODES))
def test_turn_invariants_hold_in_every_mode(rows, max_lag, partial, mode) -> None:
    """Random trajectories: no slot held during a tool wait, every token of every turn generated and
    consumed once, the lag bound kept across turns (newest version within max_lag; every token within
    max_token_lag under partial rollout, max_lag without), and the run at or above its limit."""
    partial = partial and partial_allowed(mode)
    p = load_preset("tiny", overrides={"max_lag": max_lag, "partial_rollout": partial})
    w = with_turns(from_arrays(np.ones((8, 4), dtype=np.int64), prompt_len=3, prompts_per_iteration=4),
                   turns_of(rows))
    r = simulate(p, w, mode)
    spec = r.result.spec
    x = r.metrics
    assert x["tokens_generated"] == w.total_response_tokens == sum(x["token_lag"]["hist"].values())
    assert x["lag_max"] <= spec.max_lag
    assert x["token_lag"]["max"] <= (spec.max_token_lag if partial else spec.max_lag)
    assert x["efficiency"] >= 1.0 - 1e-9 and x["efficiency_hardware"] >= 1.0 - 1e-9
    # the audit, on the same run again (the run is deterministic)
    units_for, on_done, n_windows = work_source(p, w, mode, spec, r.layout)
    sim = Simulation(spec, w, p.cost, units_for, on_done, n_windows)
    sim.audit = []
    again = sim.run()
    assert again.iteration_ends == r.result.iteration_ends
    _audit_invariants(sim, w, spec.slots)


def test_one_turn_trajectories_simulate_exactly_as_single_turn() -> None:
    """A multi-turn workload whose every trajectory has one turn is the single-turn run, number for number."""
    p = load_preset("tiny")
    single = build_workload(p)
    tr = turns_of([[(int(x), 0, 0.0)] for x in single.response_len.ravel()])
    multi = with_turns(single, tr)
    for mode in ("asp", "async-fifo", "sortedrl", "mindspeed-sync"):
        a, b = simulate(p, single, mode).metrics, simulate(p, multi, mode).metrics
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True), mode


def test_multi_turn_runs_are_deterministic_and_tool_waits_cost_time() -> None:
    p, w = tiny_mt()
    a = {m: simulate(p, w, m).metrics for m in ("asp", "async-fifo")}
    b = {m: simulate(p, build_workload(p), m).metrics for m in ("asp", "async-fifo")}
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    slow_p, slow_w = tiny_mt(tool_median_s=3.0)  # same tokens, slower tools
    assert np.array_equal(slow_w.response_len, w.response_len)
    assert simulate(slow_p, slow_w, "asp").metrics["wall_s"] > a["asp"]["wall_s"]


def test_partial_rollout_restamps_a_trajectory_waiting_on_its_tool() -> None:
    """max_lag 1, one trajectory per iteration with a long tool wait spanning refreshes: counted from
    its newest weights it trains at lag <= 1 while its first turn's tokens are older."""
    p = load_preset("tiny", overrides={"max_lag": 1, "max_token_lag": 8, "partial_rollout": True,
                                       "mini_batch_size": 4})
    rows = [[(5, 2, 0.1)] * 2] * 32
    rows[0] = [(5, 2, 20.0), (5, 0, 0.0)]  # group 0's first sample waits 20 s on its tool
    w = with_turns(from_arrays(np.ones((8, 4), dtype=np.int64), prompt_len=2, prompts_per_iteration=8),
                   turns_of(rows))
    r = simulate(p, w, "async-fifo")
    assert r.result.spec.partial_rollout
    x = r.metrics
    assert x["lag_max"] <= 1 and x["token_lag"]["max"] > 1  # old first-turn tokens, fresh stamp


# -------------------------------------------------------------------------------------------- limit


def test_limit_counts_tool_waits_and_tool_tokens() -> None:
    from asp_npu.sim.limit import limit

    p = load_preset("tiny")
    base = from_arrays(np.full((2, 4), 10, dtype=np.int64), prompt_len=2, prompts_per_iteration=2)
    one = with_turns(base, turns_of([[(10, 0, 0.0)]] * 8))
    two = with_turns(base, turns_of([[(4, 3, 50.0), (6, 0, 0.0)]] * 8))
    a, b = limit(p, one, False, False), limit(p, two, False, False)
    assert b.longest_s == pytest.approx(a.longest_s + 50.0 + 3 * p.cost.prefill_s_per_token, rel=1e-9)
    assert b.train_device_s == pytest.approx(a.train_device_s + 8 * 3 * p.cost.train_s_per_token)


# ---------------------------------------------------------------------------------------------- CLI


def test_bench_sim_runs_a_multi_turn_preset(tmp_path, capsys) -> None:
    out = tmp_path / "mt.json"
    mt = json.dumps(TINY_MT).replace('"', "")
    rc = cli_main(["bench", "sim", "--preset", "tiny", "--set", "workload.synth={}", "--set",
                   f"workload.multi_turn={mt}", "--modes", "asp,async-fifo,sortedrl,mindspeed-sync",
                   "--partial-rollout", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc["modes"]) == {"asp", "asp+partial", "async-fifo", "async-fifo+partial", "sortedrl",
                                 "mindspeed-sync"}
    assert doc["preset"]["workload"]["multi_turn"]["prompts"] == 24
    assert doc["workload"]["multi_turn"]["turns_mean"] > 1
    assert all(m["efficiency"] >= 1.0 - 1e-9 for m in doc["modes"].values())
    assert "x limit" in capsys.readouterr().out


def test_agentic_presets_load_with_two_turn_shapes() -> None:
    a, b = load_preset("agentic"), load_preset("agentic-bimodal")
    assert a.workload.multi_turn["shape"] == "geometric" and b.workload.multi_turn["shape"] == "bimodal"
    small = {"prompts": 64, "epochs": 2}
    wa = from_trace(synth_multiturn(MultiTurnParams(**{**a.workload.multi_turn, **small})), 16, 2)
    assert wa.multi_turn and wa.turns is not None and len(wa.turns) == wa.response_len.size
    assert replace(a.workload, multi_turn={}) != a.workload
