"""Bad input, as a new user types it, to the real CLI: every case is refused cleanly.

Each case runs `python -m asp_npu.cli ...` as a subprocess in its own folder, under a time limit, and
must end with exit code 2, exactly one line on stderr, no traceback, and the folder exactly as it
was before (no output file, no temp file, nothing changed or deleted). `CASES` is the table: one
`Bad` row per case, grouped by class of defect; a command is covered by adding rows (the helpers at
the top build the files the rows need). `python tests/test_bad_input.py` prints the per-class count.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 60.0  # per case: a hang is a failure, never a stuck suite


@dataclass(frozen=True)
class Bad:
    cls: str  # class of defect (the table in the docs counts by it)
    id: str
    argv: tuple[str, ...]  # after `asp-npu`; "{d}" is the case's folder
    files: dict[str, bytes] = field(default_factory=dict)  # written into the folder first
    fifos: tuple[str, ...] = ()  # named pipes created in the folder (a reader must not block on them)
    timeout: float = LIMIT_S


# classes of defect (rows of the table in the docs)
NUMBER = "numeric flag out of range / NaN / inf / wrong type"
FLAGS = "missing / unknown flag"
TRACE = "trace file: missing / undecodable / torn / mistyped"
PRESET_FILE = "preset / calibration file: undecodable / mistyped / out of range"
OUTPUT = "output target not a regular file / not creatable"
OUTPUT_DIR = "output folder (model) not a folder / not creatable"

# ------------------------------------------------------------------------------------ file builders


def trace_rows(epochs: int = 3, prompts: int = 4, n: int = 4) -> list[dict]:
    return [
        {"prompt_id": f"q{p}", "epoch": e, "sample_idx": s, "prompt_len": 10 + p,
         "response_len": 20 + 7 * p + s}
        for e in range(epochs)
        for p in range(prompts)
        for s in range(n)
    ]


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def trace_with(**change: object) -> bytes:
    """A valid trace whose row 5 has `change` applied (a value of ... deletes the field)."""
    rows = trace_rows()
    for k, v in change.items():
        if v is ...:
            del rows[5][k]
        else:
            rows[5][k] = v
    return jsonl(rows)


GOOD_TRACE = jsonl(trace_rows())
TORN_TRACE = GOOD_TRACE[: len(GOOD_TRACE) - 30]  # the last line cut mid-object, as a crash leaves it
NON_UTF8_TRACE = GOOD_TRACE.replace(b'"q1"', b'"q\xff\xfe1"', 1)

PRESET = b"""name: t
cluster: {devices: 6, infer_tp: 1, max_num_seqs: 8, min_trainer_devices: 2, sweep_trainer_devices: 2}
workload:
  prompts_per_iteration: 8
  n_samples_per_prompt: 4
  iterations: 2
  synth: {prompts: 32, epochs: 2, median_len: 64, max_len: 512, min_len: 4, prompt_median: 16}
rl: {mini_batch_size: 8, max_lag: 2}
cost: {decode_a: 0.01, decode_b: 0.001}
"""


def preset_with(old: bytes, new: bytes) -> bytes:
    assert old in PRESET
    return PRESET.replace(old, new)


def calib(**values: object) -> bytes:
    doc = {"schema": "asp-calib/1", "model": "m", "decode_step_s": {"a": 0.003, "b_per_seq": 1e-5}}
    doc.update(values)
    return json.dumps(doc).encode()


T = {"t.jsonl": GOOD_TRACE}
RUN_METRICS = b'{"step": 1, "reward/mean": 0.1}\n'
SYNTH = ("trace", "synth", "--prompts", "4", "--epochs", "2", "--n", "4", "--out", "{d}/out.jsonl")
PLAN = ("plan", "--trace", "{d}/t.jsonl", "--epoch", "2", "--instances", "2", "--minibatch", "16")
PLAN_OUT = (*PLAN, "--out", "{d}/plan.json")
SIM = ("bench", "sim", "--preset", "tiny", "--iterations", "2", "--modes", "asp")
SIM_P = ("bench", "sim", "--preset", "{d}/p.yaml", "--modes", "asp")


def _flag_cases() -> list[Bad]:
    out = []
    synth_bad = [
        ("--seed", "-1"), ("--seed", str(2**64)), ("--seed", "1.5"), ("--prompts", "0"), ("--prompts", "-5"),
        ("--prompts", "abc"), ("--epochs", "0"), ("--n", "0"), ("--max-len", "0"), ("--max-len", str(2**31)),
        ("--min-len", "0"), ("--min-len", "600000"), ("--median-len", "nan"), ("--median-len", "inf"),
        ("--median-len", "-1"), ("--median-len", "0"), ("--drift", "nan"), ("--drift", "inf"),
        ("--drift", "-inf"), ("--sigma-prompt", "nan"), ("--sigma-sample", "-1"), ("--sigma-epoch", "inf"),
        ("--prompt-sigma", "1e9"), ("--prompt-median", "nan"), ("--prompt-median", "0"),
        ("--prompt-median", "1e300"), ("--prompt-corr", "2"), ("--prompt-corr", "nan"),
    ]
    for flag, value in synth_bad:
        out.append(Bad(NUMBER, f"synth{flag}={value}", (*SYNTH, f"{flag}={value}")))
    out.append(Bad(NUMBER, "synth-200M-rows",
                   ("trace", "synth", "--prompts", "1000000", "--epochs", "100", "--n", "16",
                    "--out", "{d}/out.jsonl")))
    plan_bad = [
        ("--instances", "0"), ("--instances", "-1"), ("--instances", str(10**6)), ("--instances", "abc"),
        ("--minibatch", "0"), ("--minibatch", "-16"), ("--minibatch", "17"), ("--minibatch", str(2**40)),
        ("--max-lag", "-1"), ("--max-lag", str(2**40)), ("--max-num-seqs", "0"), ("--max-num-seqs", "1e3"),
        ("--train-step-s", "nan"), ("--train-step-s", "inf"), ("--train-step-s", "-1"),
        ("--cost-a", "nan"), ("--cost-a", "inf"), ("--cost-b", "-1"), ("--cost-c", "nan"),
        ("--seed", "-1"), ("--seed", str(2**64)), ("--epoch", "-1"), ("--epoch", str(2**40)),
        ("--epoch", "9"), ("--predictor", "bogus"), ("--dispatch", "bogus"),
    ]
    for flag, value in plan_bad:
        argv = list(PLAN_OUT)
        if flag in argv:
            i = argv.index(flag)
            argv[i + 1] = value
        else:
            argv += [flag, value]
        out.append(Bad(NUMBER, f"plan{flag}={value}",
                       tuple(argv), dict(T)))
    out.append(Bad(NUMBER, "plan-cost-a0-b0",
                   (*PLAN_OUT, "--cost-a", "0", "--cost-b", "0"), dict(T)))
    for flag, value in (("--epoch", "-1"), ("--epoch", str(2**40)), ("--epoch", "7"),
                        ("--predictor", "bogus"), ("--epoch", "x")):
        argv = ["predict-eval", "--trace", "{d}/t.jsonl", "--epoch", "2"]
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
        out.append(Bad(NUMBER, f"predict-eval{flag}={value}",
                       tuple(argv), dict(T)))
    for flag, value in (("--iterations", "0"), ("--iterations", str(2**40)), ("--max-lag", "-1"),
                        ("--modes", "bogus"), ("--instances", "0"), ("--instances", "a,b")):
        out.append(Bad(NUMBER, f"sim{flag}={value}",
                       (*SIM, flag, value)))
    for setting in ("cost.decode_a=.nan", "cost.train_s_per_token=.inf", "max_lag=-1", "bogus=1",
                    "cluster.devices=1e400", "cluster.max_num_seqs=99999999999", "cost.refresh_s=-1",
                    "workload.synth={drift: .nan}", "noequals"):
        out.append(Bad(NUMBER, f"sim--set {setting}",
                       (*SIM, "--set", setting)))
    out.append(Bad(FLAGS, "synth-no-out", ("trace", "synth", "--prompts", "4")))
    out.append(Bad(FLAGS, "synth-unknown-flag", (*SYNTH, "--bogus", "1")))
    out.append(Bad(FLAGS, "trace-no-subcommand", ("trace",)))
    out.append(Bad(FLAGS, "plan-no-trace", ("plan", "--epoch", "1")))
    out.append(Bad(FLAGS, "sim-no-preset", ("bench", "sim")))
    return out


def _file_cases() -> list[Bad]:
    out = []
    trace_defects = {
        "no-such-file": None,
        "directory": "dir",
        "fifo": "fifo",
        "non-utf8": NON_UTF8_TRACE,
        "torn-last-line": TORN_TRACE,
        "malformed-json": GOOD_TRACE.replace(b'"epoch": 1', b'"epoch": 1,,', 1),
        "empty": b"",
        "not-an-object": GOOD_TRACE + b"[1, 2]\n",
        "len-is-string": trace_with(response_len="12"),
        "len-is-float": trace_with(response_len=12.5),
        "len-is-bool": trace_with(response_len=True),
        "len-negative": trace_with(response_len=-3),
        "len-beyond-int32": trace_with(response_len=2**31),
        "len-beyond-int64": trace_with(response_len=2**70),
        "len-infinity-literal": GOOD_TRACE.replace(b'"response_len": 20}', b'"response_len": Infinity}', 1),
        "len-nan-literal": GOOD_TRACE.replace(b'"response_len": 20}', b'"response_len": NaN}', 1),
        "missing-field": trace_with(prompt_len=...),
        "empty-prompt-id": trace_with(prompt_id=""),
        "prompt-id-null": trace_with(prompt_id=None),
        "duplicate-sample": jsonl(trace_rows() + [trace_rows()[0]]),
        "groups-differ": jsonl([r for r in trace_rows() if (r["prompt_id"], r["sample_idx"]) != ("q1", 3)]),
    }
    for name, content in trace_defects.items():
        files, fifos = {}, ()
        if content == "fifo":
            fifos = ("t.jsonl",)
        elif content == "dir":
            files = {"t.jsonl/keep": b""}
        elif content is not None:
            files = {"t.jsonl": content}
        out.append(Bad(TRACE, f"plan-trace-{name}",
                       PLAN_OUT, files, fifos))
        if name in ("non-utf8", "torn-last-line", "len-is-string", "fifo", "len-nan-literal"):
            out.append(Bad(TRACE, f"predict-eval-trace-{name}",
                           ("predict-eval", "--trace", "{d}/t.jsonl", "--epoch", "2"), files, fifos))
            out.append(Bad(TRACE, f"sim-trace-{name}",
                           (*SIM, "--trace", "{d}/t.jsonl"), files, fifos))
    preset_defects = {
        "non-utf8": PRESET.replace(b"name: t", b"name: t\xff\xfe"),
        "invalid-yaml": PRESET + b"rl: [\n",
        "top-level-list": b"- 1\n- 2\n",
        "unknown-key": PRESET + b"bogus: 1\n",
        "devices-wrong-type": preset_with(b"devices: 6", b"devices: many"),
        "devices-zero": preset_with(b"devices: 6", b"devices: 0"),
        "decode-a-nan": preset_with(b"decode_a: 0.01", b"decode_a: .nan"),
        "decode-a-inf": preset_with(b"decode_a: 0.01", b"decode_a: .inf"),
        "decode-b-negative": preset_with(b"decode_b: 0.001", b"decode_b: -0.001"),
        "max-lag-negative": preset_with(b"max_lag: 2", b"max_lag: -1"),
        "iterations-huge": preset_with(b"iterations: 2", b"iterations: 99999999999"),
        "synth-wrong-type": preset_with(b"prompts: 32", b'prompts: "x"'),
        "synth-seed-negative": preset_with(b"prompts: 32", b"prompts: 32, seed: -1"),
        "synth-drift-nan": preset_with(b"prompts: 32", b"prompts: 32, drift: .nan"),
        "synth-not-a-mapping": preset_with(
            b"synth: {prompts: 32, epochs: 2, median_len: 64, max_len: 512, min_len: 4, prompt_median: 16}",
            b"synth: 5",
        ),
        "synth-unknown-key": preset_with(b"prompts: 32", b"prompts: 32, bogus: 1"),
        "trace-not-a-path": preset_with(b"  iterations: 2\n", b"  iterations: 2\n  trace: 5\n"),
        "sources-a-list": PRESET + b"sources: [a, b]\n",
        "minibatch-not-groups": preset_with(b"mini_batch_size: 8", b"mini_batch_size: 6"),
    }
    for name, content in preset_defects.items():
        out.append(Bad(PRESET_FILE, f"sim-preset-{name}",
                       SIM_P, {"p.yaml": content}))
    out.append(Bad(PRESET_FILE, "sim-preset-missing",
                   ("bench", "sim", "--preset", "{d}/none.yaml")))
    out.append(Bad(PRESET_FILE, "sim-preset-unknown",
                   ("bench", "sim", "--preset", "no-such-preset")))
    calib_defects = {
        "non-utf8": calib()[:-1] + b'\xff"}',
        "nan-literal": calib().replace(b"0.003", b"NaN"),
        "negative": calib(refresh_s=-1.0),
        "string": calib(refresh_s="fast"),
        "huge": calib(prefill_s_per_token=1e300),
        "wrong-schema": calib(schema="x/1"),
        "not-an-object": b"[1, 2]",
        "torn": calib()[:-9],
        "step-not-an-object": calib(decode_step_s=[1, 2]),
    }
    for name, content in calib_defects.items():
        out.append(Bad(PRESET_FILE, f"sim-calib-{name}",
                       (*SIM, "--calib", "{d}/c.json"), {"c.json": content}))
    out.append(Bad(PRESET_FILE, "sim-calib-missing",
                   (*SIM, "--calib", "{d}/none.json")))
    return out


def _output_cases() -> list[Bad]:
    out = []
    targets = {
        "dev-full": "/dev/full",
        "dev-null": "/dev/null",
        "directory": "{d}",
        "missing-folder": "{d}/missing/x",
        "empty": "",
        "fifo": "{d}/f",
        "parent-is-file": "{d}/t.jsonl/x",
    }
    for name, target in targets.items():
        fifos = ("f",) if name == "fifo" else ()
        out.append(Bad(OUTPUT, f"synth-out-{name}",
                       (*SYNTH[:-1], target), dict(T), fifos))
        out.append(Bad(OUTPUT, f"plan-out-{name}",
                       (*PLAN, "--out", target), dict(T), fifos))
        if name in ("dev-full", "directory", "fifo"):
            out.append(Bad(OUTPUT, f"sim-json-{name}",
                           (*SIM, "--json", target), dict(T), fifos))
        out.append(Bad(OUTPUT, f"sim-plot-{name}", (*SIM, "--plot", target), dict(T), fifos))
        out.append(Bad(OUTPUT, f"sim-timeline-{name}", (*SIM, "--timeline", target), dict(T), fifos))
        out.append(Bad(OUTPUT, f"report-out-{name}", ("report", "{d}/run", "--out", target),
                       {**T, "run/metrics.jsonl": RUN_METRICS}, fifos))
        if name != "directory":  # an existing empty folder is a valid model target
            out.append(Bad(OUTPUT_DIR, f"init-model-out-{name}", ("init-model", "--out", target), dict(T),
                           fifos))
    out.append(Bad(OUTPUT_DIR, "init-model-out-file-no-force", ("init-model", "--out", "{d}/t.jsonl"),
                   dict(T)))
    out.append(Bad(OUTPUT_DIR, "init-model-fifo-force", ("init-model", "--out", "{d}/f", "--force"),
                   fifos=("f",)))
    out.append(Bad(OUTPUT_DIR, "init-model-not-empty", ("init-model", "--out", "{d}/m"),
                   {"m/config.json": b"{}"}))
    return out


CASES: list[Bad] = _flag_cases() + _file_cases() + _output_cases()


# ------------------------------------------------------------------------------------------ harness


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under `folder`: kind and, for files, content hash (what "nothing changed" means)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        mode = p.lstat().st_mode
        if stat.S_ISREG(mode):
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[str(p.relative_to(folder))] = stat.filemode(mode)[0]
    return out


def device_state() -> dict[str, str]:
    return {d: stat.filemode(os.lstat(d).st_mode) for d in ("/dev/full", "/dev/null") if os.path.exists(d)}


def run_case(case: Bad, folder: Path) -> subprocess.CompletedProcess:
    """The real CLI on `case.argv`, in `folder` (already holding the case's files)."""
    argv = [a.replace("{d}", str(folder)) for a in case.argv]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "asp_npu.cli", *argv],
        cwd=folder,
        capture_output=True,
        timeout=case.timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def test_the_table_is_large_and_ids_unique() -> None:
    assert len(CASES) >= 80
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_cleanly(case: Bad, tmp_path: Path) -> None:
    folder = tmp_path / "case"
    folder.mkdir()
    devices = device_state()
    for name, data in case.files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    for name in case.fifos:
        os.mkfifo(folder / name)
    before = snapshot(folder)
    try:
        r = run_case(case, folder)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case.id}: no answer within {case.timeout} s (a hang)")
    err = r.stderr.decode("utf-8", errors="replace")
    assert "Traceback" not in err, err
    assert r.returncode == 2, f"exit {r.returncode}: {err}"
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("asp-npu "), err
    assert snapshot(folder) == before, "the command left, changed or deleted files"
    assert device_state() == devices, "a device node was replaced"


# ---------------------------------------------- the library layer under those commands (in-process)


def test_atomic_write_full_disk_leaves_the_old_file_and_no_temp(tmp_path: Path, monkeypatch) -> None:
    import errno

    from asp_npu import io
    from asp_npu.errors import UserError

    target = tmp_path / "plan.json"
    target.write_text("old")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(io.os, "fsync", full)
    with pytest.raises(UserError, match="No space left on device"):
        io.atomic_write(target, "new" * 1000)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_atomic_write_fsyncs_file_and_folder_with_unique_temp_names(tmp_path: Path, monkeypatch) -> None:
    from asp_npu import io

    synced: list[int] = []
    real_fsync, real_replace = os.fsync, os.replace
    temps: list[str] = []
    monkeypatch.setattr(io.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    monkeypatch.setattr(io.os, "replace", lambda a, b: (temps.append(str(a)), real_replace(a, b))[1])
    io.atomic_write(tmp_path / "a.json", "1")
    io.atomic_write(tmp_path / "a.json", "2")
    assert len(synced) >= 4  # file and folder, twice
    assert len(set(temps)) == 2 and all(Path(t).parent == tmp_path for t in temps)
    assert (tmp_path / "a.json").read_text() == "2"


def test_atomic_write_refuses_a_fifo(tmp_path: Path) -> None:
    from asp_npu.errors import UserError
    from asp_npu.io import atomic_write

    os.mkfifo(tmp_path / "f")
    with pytest.raises(UserError, match="not a regular file"):
        atomic_write(tmp_path / "f", "x")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "f").st_mode)


def test_json_text_never_writes_bare_nan() -> None:
    from asp_npu.io import json_text

    text = json_text({"a": float("nan"), "b": [float("inf"), 1.5]})
    assert json.loads(text) == {"a": None, "b": [None, 1.5]}


def test_nan_planner_costs_are_refused_not_looped() -> None:
    import numpy as np

    from asp_npu.errors import InvalidValue
    from asp_npu.schedule.cost import CostModel
    from asp_npu.schedule.planner import PlannerConfig
    from asp_npu.schedule.timeline import timeline

    for bad in ({"a": float("nan")}, {"b": float("inf")}, {"c": -1.0}):
        with pytest.raises(InvalidValue):
            CostModel(**bad)
    for bad in ({"train_step_s": float("nan")}, {"train_step_s": float("inf")}, {"seed": -1}):
        with pytest.raises(ValueError):
            PlannerConfig(num_instances=2, minibatch=4, group_size=2, **bad).validate()
    with pytest.raises(ValueError, match="finite"):
        timeline([[0], [1]], np.array([1.0, np.nan]), np.array([2, 2]), 4, 1, 0.0)


def test_readers_name_the_line_of_undecodable_or_torn_data(tmp_path: Path) -> None:
    from asp_npu.data.datasets import load_dataset
    from asp_npu.data.tasks import LengthDist
    from asp_npu.errors import UserError

    bad = tmp_path / "d.jsonl"
    bad.write_bytes(b'{"prompt": "a", "response": "b"}\n{"prompt": "\xff", "response": "c"}\n')
    with pytest.raises(UserError, match=r"d.jsonl:2: not UTF-8"):
        load_dataset(bad)
    bad.write_bytes(b'{"prompt": "a", "response": "b"}\n{"prompt": "a", "resp')
    with pytest.raises(UserError, match=r"d.jsonl:2: malformed JSON .*torn"):
        load_dataset(bad)
    bad.write_bytes(b'{"prompt": "a", "response": NaN}\n')
    with pytest.raises(UserError, match=r"d.jsonl:1: malformed JSON"):
        load_dataset(bad)
    with pytest.raises(UserError):
        load_dataset(bad, map_keys=["prompt"])  # type: ignore[arg-type]
    for kw in ({"median": float("nan")}, {"sigma": float("inf")}, {"max_items": 10**12}):
        with pytest.raises(UserError):
            LengthDist(**kw)


if __name__ == "__main__":
    for cls, n in Counter(c.cls for c in CASES).items():
        print(f"| {cls} | {n} |")
    print(f"| total | {len(CASES)} |")
