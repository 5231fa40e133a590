"""Trace format, validated reading (fast and slow paths), and the synthetic generator's shape."""

from __future__ import annotations

import json

import numpy as np
import pytest

from asp_npu.cli import main as cli_main
from asp_npu.data.traces import SynthParams, Trace, group_table, read_trace, synth_trace, write_trace
from asp_npu.errors import UserError


@pytest.fixture(scope="module")
def synth() -> Trace:
    return synth_trace(SynthParams(prompts=400, epochs=3, n=8, seed=3))


def _rows(trace: Trace) -> set[tuple]:
    return set(
        zip(
            trace.prompt_names[trace.prompt_code].tolist(),
            trace.epoch.tolist(),
            trace.sample_idx.tolist(),
            trace.prompt_len.tolist(),
            trace.response_len.tolist(),
            strict=True,
        )
    )


def test_synth_is_deterministic_and_complete(synth: Trace) -> None:
    again = synth_trace(SynthParams(prompts=400, epochs=3, n=8, seed=3))
    assert np.array_equal(again.response_len, synth.response_len)
    assert not np.array_equal(
        synth_trace(SynthParams(prompts=400, epochs=3, n=8, seed=4)).response_len, synth.response_len
    )
    assert len(synth) == 400 * 3 * 8
    assert set(synth.epochs.tolist()) == {0, 1, 2}


def test_synth_shape_long_tail_cap_and_persistence(synth: Trace) -> None:
    r = synth.response_len
    ratio = np.percentile(r, 99) / np.median(r)
    assert 5 <= ratio <= 12, ratio  # reasoning-RL: p99 about 5-10x the median
    assert 0 < np.mean(r == SynthParams().max_len) < 0.05  # some samples hit the cap
    means = [np.bincount(synth.prompt_code[synth.epoch == e], weights=r[synth.epoch == e]) for e in (0, 1)]
    corr = np.corrcoef(np.log(means[0]), np.log(means[1]))[0, 1]
    assert 0.6 < corr < 0.99  # strong but imperfect persistence


def test_synth_drift_grows_lengths() -> None:
    t = synth_trace(SynthParams(prompts=300, epochs=3, n=4, seed=1, drift=0.2))
    med = [np.median(t.response_len[t.epoch == e]) for e in range(3)]
    assert med[0] < med[1] < med[2]


def test_write_read_roundtrip(tmp_path, synth: Trace) -> None:
    path = write_trace(synth, tmp_path / "t.jsonl")
    back = read_trace(path)
    assert _rows(back) == _rows(synth)
    assert back.prompt_code.dtype == np.int64


def test_slow_path_accepts_int_prompt_ids_and_blank_lines(tmp_path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(
        '{"prompt_id": 7, "epoch": 0, "sample_idx": 0, "prompt_len": 5, "response_len": 9}\n\n'
        '{"prompt_id": "a", "epoch": 0, "sample_idx": 0, "prompt_len": 5, "response_len": 3, "extra": 1}\n'
    )
    t = read_trace(p)
    assert sorted(t.prompt_names.tolist()) == ["7", "a"]


ROW = {"prompt_id": "a", "epoch": 0, "sample_idx": 0, "prompt_len": 5, "response_len": 9}


@pytest.mark.parametrize(
    "bad, expect",
    [
        ("{not json", ":2: malformed JSON"),
        (
            json.dumps({k: v for k, v in ROW.items() if k != "response_len"}),
            ":2: missing field 'response_len'",
        ),
        (
            json.dumps({**ROW, "sample_idx": 1, "response_len": 0}),
            ":2: field 'response_len' must be a positive",
        ),
        (json.dumps({**ROW, "sample_idx": 1, "prompt_len": -3}), ":2: field 'prompt_len' must be a positive"),
        (json.dumps({**ROW, "sample_idx": 1, "epoch": -1}), ":2: field 'epoch'"),
        (
            json.dumps({**ROW, "sample_idx": 1, "response_len": 2.5}),
            ":2: field 'response_len' has wrong type",
        ),
        (json.dumps({**ROW, "sample_idx": 1, "epoch": True}), ":2: field 'epoch' has wrong type"),
        (json.dumps(ROW), ":2: duplicate sample"),
        ("[1, 2]", ":2: expected a JSON object"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, bad: str, expect: str) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(ROW) + "\n" + bad + "\n")
    with pytest.raises(UserError, match=expect.replace("(", r"\(").replace("[", r"\[")) as err:
        read_trace(p)
    assert "\n" not in str(err.value) and str(p) in str(err.value)


def test_missing_and_empty_files(tmp_path) -> None:
    with pytest.raises(UserError, match="no such file"):
        read_trace(tmp_path / "nope.jsonl")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(UserError, match="empty"):
        read_trace(tmp_path / "e.jsonl")


def test_group_table_rejects_uneven_groups() -> None:
    t = Trace.from_columns(["a", "a", "b"], [0, 0, 0], [0, 1, 0], [5, 5, 5], [9, 9, 9])
    with pytest.raises(UserError, match="groups differ in size"):
        group_table(t)
    codes, rows, n = group_table(t.select(t.prompt_code == 0))
    assert n == 2 and rows.shape == (1, 2)


def test_epoch_rows_names_missing_epoch(synth: Trace) -> None:
    with pytest.raises(UserError, match="epoch 9 is not in the trace"):
        synth.epoch_rows(9)


def test_trace_synth_cli(tmp_path, capsys) -> None:
    out = tmp_path / "s.jsonl"
    rc = cli_main(
        [
            "trace",
            "synth",
            "--prompts",
            "20",
            "--epochs",
            "2",
            "--n",
            "4",
            "--seed",
            "1",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rows"] == 160 and len(read_trace(out)) == 160


def test_trace_synth_cli_bad_input(tmp_path, capsys) -> None:
    assert cli_main(["trace", "synth", "--prompts", "0", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert cli_main(["trace", "synth", "--out", str(tmp_path / "no" / "x.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("asp-npu trace: error:") for line in err)
    assert not list(tmp_path.iterdir())


def test_odd_prompt_ids_survive_write_and_read(tmp_path) -> None:
    ids = ['say "hi"', "back\\slash", "tab\there", "数学-7"]
    t = Trace.from_columns(ids, [0] * 4, [0] * 4, [3] * 4, [5, 6, 7, 8])
    back = read_trace(write_trace(t, tmp_path / "odd.jsonl"))
    assert sorted(back.prompt_names.tolist()) == sorted(ids)
