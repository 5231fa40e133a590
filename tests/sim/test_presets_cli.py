"""Presets, the split rule, every mode on the tiny preset, and the `bench sim` command."""

from __future__ import annotations

import json

import pytest

from asp_npu.cli import main as cli_main
from asp_npu.errors import UserError
from asp_npu.observe.bubbles import account
from asp_npu.sim.modes import MODES, SPECS, layout_for, split_devices
from asp_npu.sim.preset import load_preset
from asp_npu.sim.run import build_workload, run_modes


@pytest.fixture(scope="module")
def tiny():
    p = load_preset("tiny")
    w = build_workload(p)
    return p, w, run_modes(p, w)


def test_every_mode_conserves_tokens_bounds_lag_and_adds_up(tiny) -> None:
    p, w, runs = tiny
    assert set(runs) == set(MODES)
    for m, r in runs.items():
        x = r.metrics
        assert x["tokens_generated"] == x["tokens_in_trace"] == w.total_response_tokens, m
        assert x["lag_max"] <= r.result.spec.max_lag, m
        total = x["utilization"] + sum(x["bubbles"].values())
        assert total == pytest.approx(1.0, abs=1e-9), m
        assert x["accounting_coverage"] == pytest.approx(1.0, abs=1e-9), m
        assert x["iterations"] == p.workload.iterations
        assert 0.0 <= x["trainer_idle_ratio"] <= 1.0 and 0.0 <= x["rollouter_idle_ratio"] <= 1.0
        b = account(r.result.log, 0.0, r.result.wall_s)
        assert b.utilization == pytest.approx(x["utilization"])


def test_same_devices_and_split_rule(tiny) -> None:
    p, w, runs = tiny
    for m, r in runs.items():
        assert r.metrics["layout"]["devices"] == p.cluster.devices, m
    disagg = {r.layout for m, r in runs.items() if not SPECS[m].colocated_in_sim}
    assert disagg == {split_devices(p, w)}  # one rule for every disaggregated mode
    lay = split_devices(p, w)
    assert lay.trainer_devices >= p.cluster.min_trainer_devices
    assert lay.instances * lay.instance_devices + lay.trainer_devices == p.cluster.devices
    sweep = layout_for("asp", p, w, instances=3)
    assert sweep.instances == 3 and sweep.trainer_devices == p.cluster.sweep_trainer_devices
    assert layout_for("verl-sync", p, w, instances=3).devices == sweep.devices


def test_paper_preset_loads_with_sources() -> None:
    p = load_preset("paper", iterations=2)
    assert p.workload.iterations == 2 and p.cluster.devices == 32
    assert p.cost.decode_a == pytest.approx(0.0535) and p.cost.decode_b == pytest.approx(0.00035)
    for key in ("decode_a", "decode_b", "decode_c", "train_s_per_token", "refresh_s", "max_num_seqs"):
        assert key in p.sources


def test_cpu_preset_reads_calibration(tmp_path) -> None:
    calib = tmp_path / "calib.json"
    calib.write_text(
        json.dumps(
            {
                "schema": "asp-calib/1",
                "model": "tiny",
                "decode_step_s": {"a": 0.004, "b_per_seq": 0.0002, "c_per_kv_token": None},
                "prefill_s_per_token": 1e-5,
                "refresh_s": 0.1,
                "trainer_s_per_token": None,
                "points": {},
            }
        )
    )
    p = load_preset("cpu", calib=str(calib))
    assert p.cost.decode_a == 0.004 and p.cost.decode_b == 0.0002 and p.cost.refresh_s == 0.1
    assert any("c_per_kv_token" in n and "default" in n for n in p.notes)
    assert any("trainer_s_per_token" in n for n in p.notes)
    calib.write_text('{"schema": "other"}')
    with pytest.raises(UserError, match="asp-calib/1"):
        load_preset("cpu", calib=str(calib))
    with pytest.raises(UserError, match="not found"):
        load_preset("cpu", calib=str(tmp_path / "missing.json"))


def test_bad_presets(tmp_path) -> None:
    with pytest.raises(UserError, match="unknown preset"):
        load_preset("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: {devices: 2, infer_tp: 4}\n")
    with pytest.raises(UserError, match="cannot hold one instance"):
        load_preset(str(bad))
    bad.write_text("cost: {decode_a: fast}\n")
    with pytest.raises(UserError, match="decode_a"):
        load_preset(str(bad))
    bad.write_text("colour: blue\n")
    with pytest.raises(UserError, match="unknown key 'colour'"):
        load_preset(str(bad))


def test_cli_end_to_end(tmp_path, capsys) -> None:
    out, png, tl = tmp_path / "o.json", tmp_path / "o.png", tmp_path / "t.json"
    rc = cli_main(
        [
            "bench",
            "sim",
            "--preset",
            "tiny",
            "--iterations",
            "3",
            "--instances",
            "1,2",
            "--json",
            str(out),
            "--plot",
            str(png),
            "--timeline",
            str(tl),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "| asp |" in text and "vs mindspeed-sync" in text and "scaling sweep" in text
    doc = json.loads(out.read_text())
    assert doc["preset"]["name"] == "tiny" and set(doc["modes"]) == set(MODES)
    asp = doc["modes"]["asp"]
    for key in (
        "throughput_tokens_per_s",
        "iteration_time_mean_s",
        "iteration_time_p50_s",
        "iteration_time_p95_s",
        "samples_per_s",
        "utilization",
        "trainer_idle_ratio",
        "rollouter_idle_ratio",
        "lag_mean",
        "lag_max",
        "queue",
    ):
        assert key in asp
    assert set(asp["bubbles"]) >= {"padding", "skewness", "sorting"}
    assert set(doc["sweep"]) == {"1", "2"}
    assert png.stat().st_size > 1000
    trace = json.loads(tl.read_text())
    assert any(e.get("args", {}).get("name") == "instance 0" for e in trace["traceEvents"])


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--preset", "nope"], "unknown preset"),
        (["--preset", "tiny", "--instances", "0"], "--instances"),
        (["--preset", "tiny", "--modes", "fast"], "unknown mode"),
        (["--preset", "tiny", "--iterations", "0"], "--iterations"),
        (["--preset", "tiny", "--json", "/no/such/dir/x.json"], "does not exist"),
        (["--preset", "tiny", "--trace", "/no/such/trace.jsonl"], "not found"),
    ],
)
def test_cli_bad_input_one_line_exit_2(argv, msg, capsys) -> None:
    assert cli_main(["bench", "sim", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1


def test_unit_executor_runs_one_unit_at_a_time() -> None:
    p = load_preset("tiny", overrides={"executor": "unit", "plan_window": 2})
    w = build_workload(p)
    runs = run_modes(p, w, ["async-fifo", "asp"])
    for m, r in runs.items():
        x = r.metrics
        assert x["tokens_generated"] == w.total_response_tokens, m
        assert x["lag_max"] <= r.result.spec.max_lag, m
        assert x["accounting_coverage"] == pytest.approx(1.0, abs=1e-9), m
        spans: dict[int, list[tuple[float, float]]] = {}
        for i, _, a, b, _ in r.result.log.units:
            spans.setdefault(i, []).append((a, b))
        for i, ss in spans.items():
            ss.sort()
            assert all(b1 <= a2 + 1e-9 for (_, b1), (a2, _) in zip(ss, ss[1:], strict=False)), (m, i)
    # the same unit size for both: scheduling alone differs
    sizes = {m: {n for *_, n in r.result.log.units} for m, r in runs.items()}
    assert max(sizes["async-fifo"]) == max(sizes["asp"])
