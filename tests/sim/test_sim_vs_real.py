"""Replaying a real run directory in the simulator (asp_npu.sim.replay, benchmarks/sim_vs_real.py).

Pure logic on hand-made run files: no engine, no trainer, no tokenizer.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asp_npu.errors import UserError
from asp_npu.sim.replay import (
    build_workload,
    group_lengths,
    layout_for_run,
    preset_for_run,
    settings_from_config,
    switch_costs_from_events,
    trainer_cost_from_run,
    windows_from_plans,
    windows_from_samples,
)
from asp_npu.sim.run import simulate_layout

N = 2  # samples per group
ROOT = Path(__file__).resolve().parents[2]


def _config(mode: str = "async-fifo", **rl: Any) -> dict[str, Any]:
    return {
        "model": {"path": "/nonexistent/model"},
        "data": {"data_path": "/nonexistent/prompts.jsonl", "num_prompts": 4, "seed": 3},
        "generate_config": {"num_instances": 2, "infer_tensor_parallel_size": 1, "max_num_seqs": 8},
        "actor_config": {"micro_batch_size": 4},
        "rl_config": {
            "mode": mode,
            "n_samples_per_prompt": N,
            "mini_batch_size": 4,
            "global_batch_size": 4,
            "max_lag": 2,
            "weight_refresh_interval": 1,
            **rl,
        },
        "trainer": {"train_iters": 2},
    }


# two windows of four groups; window 1 is epoch 1 of the same prompts, in another order
WINDOWS = [
    [("p0", 0), ("p1", 0), ("p2", 0), ("p3", 0)],
    [("p2", 1), ("p0", 1), ("p3", 1), ("p1", 1)],
]
LENS = {("p0", 0): [5, 7], ("p1", 0): [3, 3], ("p2", 0): [10, 2], ("p3", 0): [4, 6]}
LENS.update({("p0", 1): [6, 6], ("p1", 1): [2, 9], ("p2", 1): [8, 1], ("p3", 1): [5, 5]})
PLEN = {"p0": 3, "p1": 4, "p2": 5, "p3": 6}


def _samples() -> list[dict[str, Any]]:
    """samples.jsonl rows in consumption order (window 1's groups consumed out of order)."""
    rows = []
    for it, win in enumerate(WINDOWS):
        for j, (pid, ep) in enumerate(reversed(win)):
            for k in (1, 0):
                rows.append(
                    {
                        "prompt_id": pid,
                        "epoch": ep,
                        "sample_idx": k,
                        "response_len": LENS[(pid, ep)][k],
                        "policy_version": 0,
                        "trainer_step": 2 * it + j // 2,
                        "step": 2 * it + j // 2,
                    }
                )
    return rows


def _plan(win: list[tuple[str, int]]) -> dict[str, Any]:
    """asp-plan/1 with two units per instance; unit ids follow window order, instances interleave."""
    units = [
        {"unit": u, "samples": [{"prompt_id": f"{p}@{e}", "sample_idx": k} for k in range(N)]}
        for u, (p, e) in enumerate(win)
    ]
    return {"schema": "asp-plan/1", "instances": [{"units": units[1::2]}, {"units": units[0::2]}]}


def test_settings_from_config_applies_each_modes_rules() -> None:
    s = settings_from_config(_config("asp"))
    assert (s.mode, s.instances, s.infer_tp, s.max_num_seqs) == ("asp", 2, 1, 8)
    assert (s.group_size, s.mini_batch_size, s.prompts_per_iteration, s.iterations) == (N, 4, 4, 2)
    assert (s.max_lag, s.steps_per_version, s.steps_per_iteration) == (2, 1, 2)
    assert (s.micro_batch_size, s.trainer_world, s.data_seed, s.colocated) == (4, 1, 3, False)
    assert s.executor == "stream"  # admission default: continuous
    assert settings_from_config(
        _config("asp", max_lag=1) | {"generate_config": {"admission": "unit"}}
    ).executor == ("unit")
    ms = settings_from_config(_config("mindspeed-sync", weight_refresh_interval=1))
    assert ms.colocated and ms.max_lag == 0 and ms.steps_per_version == 2  # refresh once per window
    assert ms.admission == "continuous"
    assert settings_from_config(_config("one-step-off")).max_lag == 1
    # global_batch_size 0 -> one minibatch of groups per iteration
    assert settings_from_config(_config(global_batch_size=0)).prompts_per_iteration == 2
    with pytest.raises(UserError, match="real-engine mode"):
        settings_from_config(_config("verl-sync"))
    with pytest.raises(UserError, match="(?i)integer"):
        settings_from_config(_config(max_lag="two"))


def test_trace_from_plans_and_samples_keeps_groups_lengths_and_iterations(tmp_path: Path) -> None:
    for w, win in enumerate(WINDOWS):
        (tmp_path / f"window_{w:04d}.json").write_text(json.dumps(_plan(win)))
    wins = windows_from_plans(tmp_path)
    assert wins == WINDOWS  # unit-id order, not instance order
    lengths = group_lengths(_samples(), N)
    assert lengths[("p2", 0)].tolist() == [10, 2]  # by sample_idx, not row order
    wl = build_workload(wins, lengths, PLEN, prompts_per_iteration=4, iterations=2)
    assert (wl.group_size, wl.num_groups, wl.num_iterations) == (N, 8, 2)
    assert wl.prompt_ids.tolist() == [p for win in WINDOWS for p, _ in win]
    assert wl.epoch.tolist() == [0] * 4 + [1] * 4
    assert wl.iteration.tolist() == [0] * 4 + [1] * 4
    assert wl.response_len.tolist() == [LENS[k] for win in WINDOWS for k in win]
    assert wl.prompt_len.tolist() == [PLEN[p] for win in WINDOWS for p, _ in win]
    assert wl.total_response_tokens == sum(sum(v) for v in LENS.values())
    # one iteration only: the first window
    assert build_workload(wins, lengths, 7, 4, 1).prompt_len.tolist() == [7] * 4
    # fallback without plans: iteration by consuming step, order of first appearance
    fb = windows_from_samples(_samples(), steps_per_iteration=2)
    assert [set(w) for w in fb] == [set(w) for w in WINDOWS]
    assert fb[1] == list(reversed(WINDOWS[1]))


def test_replay_rejects_broken_runs(tmp_path: Path) -> None:
    rows = _samples()
    with pytest.raises(UserError, match="expected 0..1"):
        group_lengths(rows[1:], N)
    with pytest.raises(UserError, match="duplicate"):
        group_lengths(rows + rows[:1], N)
    lengths = group_lengths(rows, N)
    del lengths[("p3", 1)]
    with pytest.raises(UserError, match="never consumed"):
        build_workload(WINDOWS, lengths, PLEN, 4, 2)
    with pytest.raises(UserError, match="2 windows recorded"):
        build_workload(WINDOWS, group_lengths(rows, N), PLEN, 4, 3)
    with pytest.raises(UserError, match="no prompt length"):
        build_workload(WINDOWS, group_lengths(rows, N), {"p0": 1}, 4, 2)
    (tmp_path / "window_0001.json").write_text(json.dumps(_plan(WINDOWS[1])))
    with pytest.raises(UserError, match="in sequence"):
        windows_from_plans(tmp_path)


def test_layout_and_costs_measured_in_the_run() -> None:
    s = settings_from_config(_config("async-fifo"))
    lay = layout_for_run(s, "async-fifo", cores=2)  # 2 engines on 2 cores: the trainer still gets one
    assert (lay.devices, lay.instances, lay.instance_devices, lay.trainer_devices) == (3, 2, 1, 1)
    assert layout_for_run(s, "async-fifo", cores=6).trainer_devices == 4
    ms = settings_from_config(_config("mindspeed-sync"))
    col = layout_for_run(ms, "mindspeed-sync", cores=2)
    assert (col.devices, col.instances, col.trainer_devices) == (2, 2, 2)
    lengths = {("a", 0): np.array([10, 20]), ("b", 0): np.array([5, 5])}
    # (10 + 20 + 2*3) + (5 + 5 + 2*4) = 54 tokens; 2.7 s on 2 devices -> 0.1 device-s per token
    assert trainer_cost_from_run([1.0, 1.7], lengths, {"a": 3, "b": 4}, 2) == pytest.approx(0.1)
    with pytest.raises(UserError):
        trainer_cost_from_run([], lengths, 1, 1)
    events = {
        "units": [[0, "w0/u0", 0.0, 2.0, 4], [1, "w0/u1", 0.1, 2.5, 4], [0, "w1/u2", 4.0, 5.0, 4]],
        "trainer": [
            [0.0, "lent", 1],
            [2.6, "busy", 1],
            [3.0, "wait", 1],
            [3.1, "busy", 1],
            [3.5, "paused", 1],
            [3.6, "lent", 1],
            [5.2, "busy", 1],
            [5.5, "wait", 1],
        ],
    }
    to_train, to_infer, windows = switch_costs_from_events(events)  # type: ignore[misc]
    assert windows == 2
    assert to_train == pytest.approx(((2.6 - 2.5) + (5.2 - 5.0)) / 2)
    assert to_infer == pytest.approx(4.0 - 3.5)
    assert switch_costs_from_events({"units": [], "trainer": []}) is None


def _calib(path: Path, trainer: float | None = None) -> Path:
    path.write_text(
        json.dumps(
            {
                "schema": "asp-calib/1",
                "model": "tiny",
                "decode_step_s": {"a": 0.01, "b_per_seq": 0.001, "c_per_kv_token": None},
                "prefill_s_per_token": 1e-4,
                "refresh_s": 0.05,
                "trainer_s_per_token": trainer,
            }
        )
    )
    return path


def test_preset_for_run_carries_the_settings_and_simulates(tmp_path: Path) -> None:
    s = settings_from_config(_config("async-fifo"))
    lay = layout_for_run(s, "async-fifo", cores=2)
    p = preset_for_run(s, lay, str(_calib(tmp_path / "c.json")), {"train_s_per_token": 0.02})
    assert (p.cluster.infer_tp, p.cluster.max_num_seqs) == (1, 8)
    assert (p.workload.prompts_per_iteration, p.workload.n_samples_per_prompt, p.workload.iterations) == (
        4,
        N,
        2,
    )
    assert (p.rl.mini_batch_size, p.rl.max_lag, p.rl.sync_every_minibatches, p.rl.executor) == (
        4,
        2,
        1,
        "stream",
    )
    assert (p.cost.decode_a, p.cost.decode_b, p.cost.refresh_s, p.cost.train_s_per_token) == (
        0.01,
        0.001,
        0.05,
        0.02,
    )
    assert p.cost.micro_batch_size == 4
    wl = build_workload(WINDOWS, group_lengths(_samples(), N), PLEN, 4, 2)
    for mode in ("async-fifo", "asp", "mindspeed-sync"):
        sm = settings_from_config(_config(mode))
        lm = layout_for_run(sm, mode, cores=2)
        r = simulate_layout(preset_for_run(sm, lm, str(tmp_path / "c.json")), wl, mode, lm)
        assert r.metrics["iterations"] == 2, mode
        assert r.metrics["tokens_generated"] == wl.total_response_tokens, mode
        assert r.metrics["lag_max"] <= sm.max_lag, mode


def _write_run(d: Path, mode: str) -> None:
    import yaml

    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump(_config(mode)))
    rows = [r | {"prompt_len": PLEN[r["prompt_id"]]} for r in _samples()]
    (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": i + 1, "timing/update": 0.5}) + "\n" for i in range(4))
    )
    (d / "summary.json").write_text(json.dumps({"mode": mode, "iterations": 2, "iteration_time_mean_s": 2.0}))
    (d / "plans").mkdir()
    for w, win in enumerate(WINDOWS):
        (d / "plans" / f"window_{w:04d}.json").write_text(json.dumps(_plan(win)))


def test_sim_vs_real_script_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("sim_vs_real", ROOT / "benchmarks" / "sim_vs_real.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "bench"
    _write_run(out / "async-fifo_s1", "async-fifo")
    _write_run(out / "mindspeed-sync_s1", "mindspeed-sync")
    (out / "asp_s1").mkdir()
    (out / "asp_s1" / "config.yaml").write_text("{}")  # an unfinished run: skipped, and said so
    calib = _calib(tmp_path / "calib.json")
    js = tmp_path / "out.json"
    assert mod.main(["--run-dir", str(out), "--calib", str(calib), "--json", str(js), "--cores", "2"]) == 0
    text = capsys.readouterr().out
    assert "asp_s1: skipped" in text and "| async-fifo | 1 | 2.000 |" in text
    doc = json.loads(js.read_text())
    rows = {r["mode"]: r for r in doc["runs"]}
    assert set(rows) == {"async-fifo", "mindspeed-sync"}
    fifo = rows["async-fifo"]
    assert fifo["error"] == pytest.approx(fifo["simulated_iteration_time_mean_s"] / 2.0 - 1.0)
    tokens = sum(sum(v) for v in LENS.values()) + N * 2 * sum(PLEN.values())
    assert fifo["costs"]["train_s_per_token"] == pytest.approx(4 * 0.5 * 1 / tokens)  # 1 trainer core
    assert fifo["cost_sources"]["train_s_per_token"].startswith("run metrics")
    assert fifo["cost_sources"]["decode_a"] == "calib"
    assert fifo["cost_sources"]["decode_c"].startswith("preset")  # null in the calibration
    assert fifo["workload"]["prompt_len_from"] == "samples.jsonl"
    assert fifo["layout"]["trainer_devices"] == 1
    assert rows["mindspeed-sync"]["costs"]["train_s_per_token"] == pytest.approx(4 * 0.5 * 2 / tokens)
    assert doc["modes"]["async-fifo"]["median_error"] == pytest.approx(fifo["error"])
    assert rows["mindspeed-sync"]["sim_trainer_padding_factor"] >= 1.0
    assert rows["mindspeed-sync"]["layout"]["colocated"] and not fifo["layout"]["colocated"]
    assert (
        mod.main(["--run-dir", str(out), "--calib", str(calib), "--json", str(js), "--no-sim-padding"]) == 0
    )
    ms = next(r for r in json.loads(js.read_text())["runs"] if r["mode"] == "mindspeed-sync")
    assert ms["costs"]["micro_batch_size"] == 1 and "sim_trainer_padding_factor" not in ms
    # a calibrated trainer cost wins over the run's own
    assert mod.main(["--run-dir", str(out), "--calib", str(_calib(calib, 0.123)), "--json", str(js)]) == 0
    assert json.loads(js.read_text())["runs"][0]["costs"]["train_s_per_token"] == pytest.approx(0.123)
    # a full calibration (`--run-costs none`): the colocated trainer for mindspeed-sync, core sharing
    # for the asynchronous mode only
    full = _calib(tmp_path / "full.json", 0.01)
    extra = {"trainer_s_per_token_colocated": 0.05,
             "core_sharing": {"decode_slowdown": 2.0, "train_slowdown": 3.0}}
    full.write_text(json.dumps(json.loads(full.read_text()) | extra))
    argv = ["--run-dir", str(out), "--calib", str(full), "--json", str(js), "--run-costs", "none"]
    assert mod.main(argv) == 0
    rows = {r["mode"]: r for r in json.loads(js.read_text())["runs"]}
    assert rows["mindspeed-sync"]["costs"]["train_s_per_token"] == pytest.approx(0.05)
    assert rows["mindspeed-sync"]["cost_sources"]["train_s_per_token"].startswith("calib (colocated")
    assert not rows["mindspeed-sync"]["simulated"]["core_sharing"]["applied"]
    assert rows["async-fifo"]["costs"]["train_s_per_token"] == pytest.approx(0.01)
    sh = rows["async-fifo"]["simulated"]["core_sharing"]
    assert sh["applied"] and sh["decode_slowdown"] == 2.0 and sh["train_slowdown"] == 3.0
    assert "core sharing: decode x2.00, trainer x3.00" in capsys.readouterr().out
