"""Core sharing (asp_npu.sim.contention): overlap accounting, the mean-field run, the calibration fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asp_npu.errors import UserError
from asp_npu.observe.events import EventLog
from asp_npu.sim.calibrate import calibration, sharing
from asp_npu.sim.contention import overlap_fractions, shared_cost
from asp_npu.sim.cost import SimCost
from asp_npu.sim.preset import load_preset
from asp_npu.sim.run import build_workload, simulate


def test_overlap_fractions_of_a_hand_made_log() -> None:
    log = EventLog(devices=2, trainer_devices=1)
    log.add_instance(1, 4)
    log.add_instance(1, 4)
    log.trainer_state(0.0, "wait")
    log.trainer_state(1.0, "busy")
    log.trainer_state(3.0, "wait")
    log.trainer_state(4.0, "busy")
    log.trainer_state(5.0, "wait")
    log.instance_state(0.0, 0, 4, "run")  # decodes [0, 2)
    log.instance_state(2.0, 0, 0, "drained")
    log.instance_state(0.0, 1, 0, "drained")
    log.instance_state(4.5, 1, 2, "run")  # decodes [4.5, 6), paused [6, 7)
    log.instance_state(6.0, 1, 2, "paused")
    log.instance_state(7.0, 1, 0, "drained")
    o_r, o_t = overlap_fractions(log)
    # decode 2 + 1.5 s, of which [1, 2) and [4.5, 5) under a trainer step; trainer busy 3 s, 1.5 s of it
    assert o_r == pytest.approx(1.5 / 3.5) and o_t == pytest.approx(1.5 / 3.0)


def test_shared_cost_scales_by_overlap_and_clears_the_factors() -> None:
    base = SimCost(decode_a=0.01, decode_b=0.001, train_s_per_token=1e-3,
                   share_decode_slowdown=3.0, share_train_slowdown=2.0)
    c = shared_cost(base, 0.5, 0.25)
    assert c.decode_a == pytest.approx(0.02) and c.decode_b == pytest.approx(0.002)
    assert c.train_s_per_token == pytest.approx(1.25e-3)
    assert (c.share_decode_slowdown, c.share_train_slowdown) == (1.0, 1.0)
    assert SimCost(share_decode_slowdown=0.5).validate()  # a speed-up is not a slowdown


def _calib(path: Path, decode: float | None, train: float | None) -> Path:
    path.write_text(json.dumps({
        "schema": "asp-calib/1", "model": "tiny",
        "decode_step_s": {"a": 0.006, "b_per_seq": 0.0003, "c_per_kv_token": 0.0},
        "prefill_s_per_token": 2e-5, "refresh_s": 0.05, "trainer_s_per_token": 5e-4,
        "core_sharing": {"decode_slowdown": decode, "train_slowdown": train},
    }))
    return path


def test_sharing_slows_asynchronous_modes_only_and_within_the_bounds(tmp_path: Path) -> None:
    plain = load_preset("cpu", calib=str(_calib(tmp_path / "a.json", None, None)), iterations=4)
    shared = load_preset("cpu", calib=str(_calib(tmp_path / "b.json", 2.0, 1.5)), iterations=4)
    assert (shared.cost.share_decode_slowdown, shared.cost.share_train_slowdown) == (2.0, 1.5)
    worst = load_preset("cpu", calib=str(_calib(tmp_path / "c.json", None, None)), iterations=4, overrides={
        "cost.decode_a": 0.012, "cost.decode_b": 0.0006, "cost.train_s_per_token": 7.5e-4})
    wl = build_workload(plain)
    for mode in ("async-fifo", "asp"):
        p = simulate(plain, wl, mode).metrics
        s = simulate(shared, wl, mode).metrics
        w = simulate(worst, wl, mode).metrics
        assert "core_sharing" not in p
        sh = s["core_sharing"]
        assert 0.0 < sh["decode_overlap"] <= 1.0 and 0.0 < sh["train_overlap"] <= 1.0
        assert 1.0 < sh["decode_factor"] <= 2.0 and 1.0 < sh["train_factor"] <= 1.5
        # slower than apart, no slower than if every step were slowed by the full factor
        assert p["iteration_time_mean_s"] < s["iteration_time_mean_s"] <= w["iteration_time_mean_s"] * 1.001
    sync_p = simulate(plain, wl, "mindspeed-sync").metrics
    sync_s = simulate(shared, wl, "mindspeed-sync").metrics
    assert sync_s["iteration_time_mean_s"] == pytest.approx(sync_p["iteration_time_mean_s"])
    assert "core_sharing" not in sync_s


def test_a_colocated_mode_decodes_at_the_colocated_slowdown_and_nothing_else_changes() -> None:
    from dataclasses import replace

    base = load_preset("tiny")
    slow = replace(base, cost=replace(base.cost, colocated_decode_slowdown=1.5))
    w = build_workload(base)
    sync0, sync1 = (simulate(p, w, "mindspeed-sync") for p in (base, slow))
    asp0, asp1 = (simulate(p, w, "asp") for p in (base, slow))
    assert sync1.metrics["iteration_time_mean_s"] > sync0.metrics["iteration_time_mean_s"]
    assert sync1.metrics["core_sharing"]["colocated_decode_slowdown"] == 1.5
    assert asp1.metrics["iteration_time_mean_s"] == asp0.metrics["iteration_time_mean_s"]  # not colocated


def test_calibration_carries_trainer_and_sharing(tmp_path: Path) -> None:
    tr = {
        "trainer": {"device_s_per_token": 4e-4},
        "trainer_colocated": {"device_s_per_token": 9e-4},
        "sharing": {"decode_alone_s": [0.01, 0.02, 0.01], "decode_shared_s": [0.02, 0.05, 0.012],
                    "train_alone_s": [1.0, 1.0], "train_shared_s": [0.9, 0.95]},
    }
    points = {"decode": [{"batch": b, "kv_tokens": 0, "step_s": 0.01 + 0.001 * b} for b in (1, 4)],
              "prefill": [], "refresh": [], "trainer": tr}
    d = calibration("m", points, {})
    assert d["trainer_s_per_token"] == 4e-4 and d["trainer_s_per_token_colocated"] == 9e-4
    # a ratio below 1 is noise: clamped to 1
    assert d["core_sharing"] == {"decode_slowdown": pytest.approx(2.0), "train_slowdown": 1.0,
                                 "colocated_decode_slowdown": 1.0}  # not measured: 1
    assert sharing(tr["sharing"])["decode_slowdown"] == pytest.approx(2.0)
    co = {**tr["sharing"], "colocated_decode_alone_s": [0.01, 0.0, 0.01],
          "colocated_decode_shared_s": [0.014, 0.02, 0.016]}
    assert sharing(co)["colocated_decode_slowdown"] == pytest.approx(1.5)  # the floored 0.0 pair dropped
    bad = _calib(tmp_path / "bad.json", 0.5, None)
    with pytest.raises(UserError, match="core_sharing.decode_slowdown"):
        load_preset("cpu", calib=str(bad))
