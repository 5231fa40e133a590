"""`asp-npu plan`: the happy path and every bad input -> one line, exit 2, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from asp_npu.cli import main as cli_main
from asp_npu.data.traces import SynthParams, synth_trace, write_trace
from asp_npu.schedule.plan import SCHEMA, RolloutPlan
from asp_npu.schedule.planner import PlannerConfig, check_lag_bound

ROW = '{{"prompt_id": "{}", "epoch": {}, "sample_idx": {}, "prompt_len": 9, "response_len": {}}}\n'


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    return write_trace(
        synth_trace(SynthParams(prompts=120, epochs=3, n=4, seed=2)),
        tmp_path_factory.mktemp("tr") / "t.jsonl",
    )


def test_plan_writes_schema_and_prints_summary(tmp_path, trace_path, capsys) -> None:
    out = tmp_path / "plan.json"
    rc = cli_main(
        [
            "plan",
            "--trace",
            str(trace_path),
            "--epoch",
            "2",
            "--instances",
            "4",
            "--minibatch",
            "32",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    for key in ("samples", "instances", "units", "predicted_makespan", "lower_bound", "plan_seconds"):
        assert key in summary
    assert summary["samples"] == 480 and summary["instances"] == 4
    obj = json.loads(out.read_text())
    assert obj["schema"] == SCHEMA and len(obj["instances"]) == 4
    sample = obj["instances"][0]["units"][0]["samples"][0]
    assert set(sample) == {"prompt_id", "sample_idx", "predicted_len"}
    p = RolloutPlan.read_json(out)
    assert p.num_samples == 480
    assert check_lag_bound(p, PlannerConfig(num_instances=4, minibatch=32, group_size=4)) == []


@pytest.mark.parametrize("predictor", ["prompt-len", "oracle"])
@pytest.mark.parametrize("dispatch", ["asp", "fifo"])
def test_plan_predictors_and_dispatch(trace_path, capsys, predictor, dispatch) -> None:
    assert (
        cli_main(
            [
                "plan",
                "--trace",
                str(trace_path),
                "--epoch",
                "0",
                "--instances",
                "3",
                "--minibatch",
                "8",
                "--predictor",
                predictor,
                "--dispatch",
                dispatch,
                "--max-lag",
                "0",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["dispatch"] == dispatch


def _bad_trace(tmp_path, text: str):
    p = tmp_path / "bad.jsonl"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "case, message",
    [
        ("malformed", "bad.jsonl:2: malformed JSON"),
        ("missing", "bad.jsonl:2: missing field 'response_len'"),
        ("nonpositive", "bad.jsonl:2: field 'response_len' must be a positive"),
        ("epoch", "epoch 5 is not in the trace"),
        ("k", "--instances must be an integer in [1, "),
        ("minibatch", "--minibatch 6 is not a multiple of the group size 4"),
        ("unwritable", "does not exist"),
        ("outdir", "is a directory"),
        ("uneven", "groups differ in size"),
        ("nofile", "no such file"),
        ("badflag", "unrecognized arguments"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, trace_path, capsys, case, message) -> None:
    good = "".join(ROW.format("a", 0, i, 10 + i) for i in range(4))
    trace, epoch, k, mb = trace_path, "1", "2", "8"
    out = tmp_path / "out" / "plan.json"
    (tmp_path / "out").mkdir()
    extra: list[str] = []
    if case == "malformed":
        trace = _bad_trace(tmp_path, good[: good.index("\n") + 1] + "{oops\n")
    elif case == "missing":
        trace = _bad_trace(
            tmp_path,
            ROW.format("a", 0, 0, 3) + '{"prompt_id": "a", "epoch": 0, "sample_idx": 1, "prompt_len": 3}\n',
        )
    elif case == "nonpositive":
        trace = _bad_trace(tmp_path, ROW.format("a", 0, 0, 3) + ROW.format("a", 0, 1, 0))
    elif case == "epoch":
        epoch = "5"
    elif case == "k":
        k = "0"
    elif case == "minibatch":
        mb = "6"
    elif case == "unwritable":
        out = tmp_path / "missing-dir" / "plan.json"
    elif case == "outdir":
        out = tmp_path / "out"
    elif case == "uneven":
        trace = _bad_trace(tmp_path, good + ROW.format("b", 0, 0, 5))
        epoch = "0"
    elif case == "nofile":
        trace = tmp_path / "nope.jsonl"
    elif case == "badflag":
        extra = ["--frobnicate"]
    before = set(os.listdir(tmp_path / "out"))
    rc = cli_main(
        [
            "plan",
            "--trace",
            str(trace),
            "--epoch",
            epoch,
            "--instances",
            k,
            "--minibatch",
            mb,
            "--out",
            str(out),
            *extra,
        ]
    )
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert rc == 2 and captured.out == ""
    assert len(err) == 1 and err[0].startswith("asp-npu plan: error:") and message in err[0], err
    assert set(os.listdir(tmp_path / "out")) == before  # nothing (half-)written


def test_console_entry_has_no_traceback(tmp_path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"prompt_id": "a", "epoch": 0, "sample_idx": 0, "prompt_len": 1, "response_len": -4}\n')
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "asp_npu.cli",
            "plan",
            "--trace",
            str(p),
            "--epoch",
            "0",
            "--instances",
            "1",
            "--minibatch",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_plan_split_units_evens_the_predicted_tokens_where_full_units_bind(tmp_path, trace_path) -> None:
    """120 prompts x 4 on 16 instances with 64-slot units: ~8 units, so full units cannot balance."""
    loads = {}
    for flag in ([], ["--split-units"]):
        out = tmp_path / f"plan{len(flag)}.json"
        assert cli_main(["plan", "--trace", str(trace_path), "--epoch", "2", "--instances", "16",
                         "--minibatch", "32", "--max-num-seqs", "64", "--out", str(out), *flag]) == 0
        p = RolloutPlan.read_json(out)
        assert p.num_samples == 480
        unit_of_sample = np.repeat(np.arange(p.unit_instance.size), np.diff(p.unit_offsets))
        tokens = np.bincount(p.unit_instance[unit_of_sample], weights=p.sample_predicted_len, minlength=16)
        loads[bool(flag)] = float(tokens.max() / tokens.mean())
    assert loads[True] < loads[False]
