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
