"""Partial rollout in the simulator and `bench sim --partial-rollout`; a group is stamped when it starts."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asp_npu.cli import main as cli_main
from asp_npu.config import load_config
from asp_npu.errors import ConfigError
from asp_npu.sim.cost import SimCost
from asp_npu.sim.engine import RunSpec, Simulation
from asp_npu.sim.modes import static_source
from asp_npu.sim.preset import load_preset
from asp_npu.sim.run import run_modes
from asp_npu.sim.workload import from_arrays


def test_group_waiting_for_a_slot_across_a_refresh_is_stamped_when_it_starts() -> None:
    """One instance, 2 slots, one unit [g0 short, g1 long, g2 short]: g2 waits behind g1 while the
    weights refresh to version 1, so its first token is version 1 and so is its stamp (lag 1, not 2)."""
    cost = SimCost(decode_a=1.0, decode_b=0.0, train_s_per_token=0.01, refresh_s=0.5)
    w = from_arrays(np.array([[1, 1], [50, 50], [1, 1]]), prompt_len=1, prompts_per_iteration=3)
    spec = RunSpec(mode="t", colocated=False, instances=1, slots=2, instance_devices=1, trainer_devices=1,
                   minibatch_groups=1, version_groups=1, max_lag=2, unit_exec=True, devices=2)
    res = Simulation(spec, w, cost, static_source(w, 1, "chunk")).run()
    assert res.lags == [0, 1, 1]
    # g0: 2 tokens at step 0 (lag 0); g1 (step 1): 1 token each before the refresh (lag 1), 49 each
    # after it (lag 0); g2 (step 2): 2 tokens of version 1 (lag 1)
    assert res.token_lag_hist == {0: 2 + 98, 1: 2 + 2}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 400), min_size=64, max_size=64),
    max_lag=st.integers(1, 3),
    extra=st.integers(0, 2),
    executor=st.sampled_from(["stream", "unit"]),
)
def test_partial_rollout_keeps_both_bounds(lengths, max_lag, extra, executor) -> None:
    """Random workloads: with partial rollout no group is consumed beyond max_lag by its newest
    version and no token beyond max_token_lag; every token is generated and consumed once."""
    p = load_preset("tiny", overrides={"max_lag": max_lag, "max_token_lag": max_lag + extra,
                                       "partial_rollout": True, "executor": executor})
    w = from_arrays(np.array(lengths).reshape(16, 4), prompt_len=3, prompts_per_iteration=8)
    for m, r in run_modes(p, w, ["asp", "async-fifo", "one-step-off"]).items():
        x = r.metrics
        assert x["lag_max"] <= r.result.spec.max_lag, m
        assert x["token_lag"]["max"] <= r.result.spec.max_token_lag, m
        assert sum(x["token_lag"]["hist"].values()) == w.total_response_tokens == x["tokens_generated"], m
        assert x["accounting_coverage"] == pytest.approx(1.0, abs=1e-9), m


def test_partial_rollout_lets_admission_run_ahead_of_a_straggler() -> None:
    """max_lag 1, one 400-token sample per iteration (4 weight versions): counting lag from the
    newest weights lets the trainer take later versions while the straggler decodes (4.62 -> 2.59 s
    per iteration here); its oldest tokens are then older, within max_token_lag."""
    p = load_preset("tiny", overrides={"max_lag": 1, "max_token_lag": 8})
    lengths = np.full((48, 4), 20)
    lengths[::8, 0] = 400
    w = from_arrays(lengths, prompt_len=4, prompts_per_iteration=8)
    off = run_modes(p, w, ["asp"])["asp"].metrics
    on = run_modes(replace(p, rl=replace(p.rl, partial_rollout=True)), w, ["asp"])["asp"].metrics
    assert on["iteration_time_mean_s"] < 0.7 * off["iteration_time_mean_s"]
    assert on["token_lag"]["max"] > off["token_lag"]["max"]  # the price: older tokens, within the bound


def test_cli_partial_rollout_side_by_side(tmp_path, capsys) -> None:
    out = tmp_path / "o.json"
    argv = ["bench", "sim", "--preset", "tiny", "--iterations", "3", "--modes", "asp,mindspeed-sync",
            "--partial-rollout", "--json", str(out)]
    assert cli_main(argv) == 0
    text = capsys.readouterr().out
    assert "| asp+partial |" in text and "token lag mean/max" in text
    doc = json.loads(out.read_text())
    assert list(doc["modes"]) == ["asp", "asp+partial", "mindspeed-sync"]
    assert doc["modes"]["asp+partial"]["layout"]["max_token_lag"] == 8  # 4 x max_lag by default
    assert "efficiency" in doc["modes"]["asp"] and doc["modes"]["asp"]["efficiency"] >= 1.0


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--modes", "mindspeed-sync", "--partial-rollout"], "none of the selected modes"),
        (["--modes", "sortedrl", "--set", "rl.partial_rollout=true"], "synchronous or colocated"),
        (["--set", "rl.max_token_lag=1"], "max_token_lag"),
    ],
)
def test_cli_bad_partial_input_one_line_exit_2(argv, msg, capsys) -> None:
    assert cli_main(["bench", "sim", "--preset", "tiny", "--iterations", "2", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "overrides,msg",
    [
        (["rl_config.max_lag=2", "rl_config.max_token_lag=1"], "max_token_lag: must be >="),
        (["rl_config.partial_rollout=true", "rl_config.mode=mindspeed-sync"], "synchronous or colocated"),
        (["rl_config.partial_rollout=true", "rl_config.weight_refresh_mode=drain"], "inflight"),
    ],
)
def test_config_partial_rollout_keys(overrides, msg) -> None:
    assert load_config(None, ["rl_config.max_token_lag=3"]).rl_config.max_token_lag == 3
    assert load_config(None, ["rl_config.partial_rollout=true"]).rl_config.partial_rollout
    with pytest.raises(ConfigError, match=msg):
        load_config(None, overrides)
