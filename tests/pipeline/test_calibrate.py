"""`asp-npu calibrate`: the cost fit and argument checks (the measurement itself runs in test_vllm_engine)."""

from __future__ import annotations

import pytest

from asp_npu.cli import main as cli_main
from asp_npu.sim.calibrate import fit


def test_fit_recovers_step_cost_and_drops_negative_terms():
    a, b, c = 0.004, 0.0003, 2e-7
    decode = [
        {"batch": bb, "prompt_len": p, "kv_tokens": bb * (p + 40), "step_s": a + b * bb + c * bb * (p + 40)}
        for p in (16, 256)
        for bb in (1, 4, 16, 64)
    ]
    prefill = [{"prompt_tokens": n, "ttft_s": 0.01 + 2e-5 * n} for n in (32, 128, 512)]
    got = fit({"decode": decode, "prefill": prefill, "refresh": [{"total_s": 0.5}, {"total_s": 0.7}]})
    assert got["decode_step_s"] == pytest.approx({"a": a, "b_per_seq": b, "c_per_kv_token": c}, rel=1e-6)
    assert got["prefill_s_per_token"] == pytest.approx(2e-5) and got["refresh_s"] == pytest.approx(0.6)
    # a KV term that the data contradicts is dropped, not reported negative
    for p in decode:
        p["step_s"] = a + b * p["batch"] - 1e-8 * p["kv_tokens"] * (p["prompt_len"] == 256)
    got = fit({"decode": decode, "prefill": prefill[:1], "refresh": []})
    assert got["decode_step_s"]["c_per_kv_token"] == 0.0 and got["decode_step_s"]["a"] > 0
    assert got["prefill_s_per_token"] is None and got["refresh_s"] is None


def test_cli_rejects_bad_arguments_before_any_engine_starts(tmp_path, capsys):
    out = str(tmp_path / "c.json")
    assert cli_main(["calibrate", "--config", str(tmp_path / "nope.yaml"), "--out", out]) == 2
    assert "config file not found" in capsys.readouterr().err
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model:\n  path: {tmp_path / 'missing'}\n  build_if_missing: false\n")
    assert cli_main(["calibrate", "--config", str(cfg), "--out", str(tmp_path / "no" / "c.json")]) == 2
    assert cli_main(["calibrate", "--config", str(cfg), "--out", str(tmp_path / "c.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_trainer_calibration_batch_has_the_config_minibatch_shape(tiny_model_dir):
    """One minibatch of whole groups, the config's prompts, answers spread over 1..max_tokens."""
    from asp_npu.config import load_config
    from asp_npu.trainer.calibrate import batch_tokens, calibration_batch

    cfg = load_config(None, [f"model.path={tiny_model_dir}", "rl_config.mini_batch_size=16",
                             "rl_config.n_samples_per_prompt=4",
                             "generate_config.sampling_config.max_tokens=40"])
    b = calibration_batch(cfg)
    assert b.num_samples == 16 and b.group_size == 4
    ids = [t.prompt_id for t in b.trajectories]
    assert all(len(set(ids[g * 4:(g + 1) * 4])) == 1 for g in range(4)) and len(set(ids)) == 4
    lens = sorted(t.response_len for t in b.trajectories)
    assert lens[0] == 1 and lens[-1] == 40 and all(len(t.logprobs) == t.response_len for t in b.trajectories)
    assert all(len(t.prompt_token_ids) <= cfg.rl_config.max_prompt_length for t in b.trajectories)
    assert batch_tokens(b) == sum(len(t.prompt_token_ids) + t.response_len for t in b.trajectories)
    assert [t.response_token_ids for t in calibration_batch(cfg).trajectories] == [
        t.response_token_ids for t in b.trajectories]  # the same batch every time


def test_every_printed_figure_carries_its_spread_and_one_trust_line(capsys, tmp_path):
    from asp_npu.cli.calibrate import print_result
    from asp_npu.sim.calibrate import calibration

    decode = [{"batch": n, "prompt_len": 16, "kv_tokens": 0.0, "step_s": 0.004 + 3e-4 * n,
               "step_s_runs": [(0.004 + 3e-4 * n) * f for f in (1.0, 1.2, 1.0)]} for n in (1, 4, 16)]
    prefill = [{"prompt_tokens": p, "ttft_s": 1e-4 * p, "ttft_s_runs": [1e-4 * p] * 3} for p in (32, 128)]
    points = {"decode": decode, "prefill": prefill, "refresh": [{"total_s": 0.5}] * 3,
              "matmul_flops_per_s": [2e10, 2.01e10, 1.99e10]}
    doc = calibration("m", points, {"foreign_load": {"mean": 0.01, "loadavg_1m_max": 0.5}})
    assert doc["matmul_flops_per_s"] == 2e10 and not doc["trust"]["trusted"]
    print_result(str(tmp_path / "c.json"), doc)
    out = capsys.readouterr().out.splitlines()
    figures = [line for line in out if line.startswith("  ")]
    assert len(figures) == 8 and all("spread" in line for line in figures), out  # 6 + the decode corners
    assert sum("decode step at batch" in line for line in figures) == 2
    assert out[-1].startswith("calibration NOT trusted") and "decode_" in out[-1]
    assert cli_main(["calibrate", "--config", "configs/cpu_tiny.yaml", "--out", str(tmp_path / "c.json"),
                     "--max-spread", "0"]) == 2
    assert "--max-spread" in capsys.readouterr().err


def test_host_optimizer_probe_lands_in_the_calibration_json(monkeypatch, tmp_path, capsys):
    """The host Adam probe (megatron's HybridDeviceOptimizer step on the host) gives a positive finite
    seconds per parameter, repeated like the other probes; `calibrate` writes its median and spread
    and prints it (the engine measurement is stubbed: no engine starts)."""
    import json
    import math

    import asp_npu.pipeline.calibrate as pc
    import asp_npu.trainer.calibrate as tc

    one = tc.host_optimizer_s_per_param(params=1 << 16, min_s=0.01)
    assert math.isfinite(one) and 0 < one < 1e-3
    monkeypatch.setattr(tc, "HOST_OPTIMIZER_PARAMS", 1 << 18)
    decode = [{"batch": n, "prompt_len": 16, "kv_tokens": 16.0 * n, "step_s": 0.004 + 3e-4 * n}
              for n in (1, 4)]
    prefill = [{"prompt_tokens": p, "ttft_s": 1e-4 * p} for p in (32, 128)]
    fake = pc.EngineMeasurement("m", {"decode": decode, "prefill": prefill, "refresh": []}, {})

    def measured(*a, between=lambda: None):  # the engine's probes, stubbed; what runs between them runs
        between()
        return fake

    monkeypatch.setattr(pc, "_measure_config", measured)
    out = tmp_path / "c.json"
    assert cli_main(["calibrate", "--config", "configs/cpu_tiny.yaml", "--out", str(out), "--quick",
                     "--repeats", "2", "--no-trainer"]) == 0
    doc = json.loads(out.read_text())
    runs = doc["points"]["host_optimizer_s_per_param"]
    assert len(runs) == 2 and all(math.isfinite(x) and x > 0 for x in runs)
    assert doc["host_optimizer_s_per_param"] == pytest.approx(sum(runs) / 2)
    assert doc["spread"]["host_optimizer_s_per_param"]["n"] == 2
    assert len(doc["points"]["matmul_flops_per_s"]) == 3  # at the start, between the probes, at the end
    line = [s for s in capsys.readouterr().out.splitlines() if "host optimizer step per parameter" in s]
    assert len(line) == 1 and "spread" in line[0]
