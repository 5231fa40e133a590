"""Nothing a user types destroys their files (issue 30): outputs on inputs or on another run, corrupt
model folders / checkpoints / run directories, unbounded sizes and misleading messages.

`CASES` runs the real CLI like tests/test_bad_input_commands.py: exit 2, one line on stderr naming the
problem, no traceback, and the whole workspace byte-identical afterwards (nothing written, replaced or
deleted). The fuzz tests truncate and corrupt every structured file of a model folder, a checkpoint
and a run directory at several offsets: each is refused in one line, or (a run's streamed logs) read
the way a killed run's torn last line is read.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from asp_npu.errors import UserError
from tests.test_bad_input import GOOD_TRACE
from tests.test_bad_input_commands import CONFIG, REPO, SMALL, run_cli

TRAIN = ["train", CONFIG, *SMALL, "trainer.run_dir={ws}/new_run"]
PLAN = ["plan", "--trace", "{ws}/t.jsonl", "--epoch", "2", "--instances", "2", "--minibatch", "16"]
SIM = ["bench", "sim", "--preset", "tiny", "--iterations", "2", "--modes", "asp"]
IMPORT = ["import-config", "mindspeed-rl"]
MS = str(REPO / "tests" / "deploy" / "fixtures" / "grpo_qwen25_7b_A3.yaml")

OUT_IS_INPUT, OTHER_RUN, FOREIGN_FOLDER, CORRUPT, LIMIT, MESSAGE = (
    "output on an input", "output in another run", "folder output not ours", "corrupt input",
    "unbounded input", "misleading message")

# (class, command, expected text in the one stderr line)
CASES: list[tuple[str, list[str], str]] = [
    (OUT_IS_INPUT, [*PLAN, "--out", "{ws}/t.jsonl"], "is the input --trace"),
    (OUT_IS_INPUT, [*PLAN, "--out", "{ws}/../{wsname}/t.jsonl"], "is the input --trace"),
    (OUT_IS_INPUT, [*SIM, "--trace", "{ws}/t.jsonl", "--json", "{ws}/t.jsonl"], "is the input --trace"),
    (OUT_IS_INPUT, [*SIM, "--json", "{ws}/o.json", "--plot", "{ws}/o.json"], "one would replace the other"),
    (OUT_IS_INPUT, [*IMPORT, "{ws}/ms.yaml", "--out", "{ws}/ms.yaml"], "is the input file"),
    (OUT_IS_INPUT, ["report", "{ws}/run_a", "--out", "{ws}/run_a/metrics.jsonl"], "is the input run file"),
    (OUT_IS_INPUT, ["calibrate", "--config", "{ws}/ours.yaml", "--out", "{ws}/ours.yaml"],
     "is the input --config"),
    (OUT_IS_INPUT, ["sft", CONFIG, "model.path={ws}/model", "--out", "{ws}/model/sub", "sft.steps=1"],
     "lies inside the input model.path"),
    (OUT_IS_INPUT, ["sft", CONFIG, "model.path={ws}/model", "--out", "{ws}/model", "sft.steps=1"],
     "is the input model.path"),
    (OUT_IS_INPUT, [*TRAIN[:-1], "trainer.run_dir={ws}/model/run", "model.path={ws}/model"],
     "lies inside the input model.path"),
    (OUT_IS_INPUT, ["bench", "real", "--config", "{ws}/ours.yaml", "--modes", "asp", "--out-dir",
                    "{ws}/bench_new", "--json", "{ws}/ours.yaml", *SMALL], "is the input --config"),
    (OTHER_RUN, ["report", "{ws}/run_a", "--out", "{ws}/run_b/report.png"], "part of the run directory"),
    (OTHER_RUN, ["trace", "synth", "--out", "{ws}/run_a/samples.jsonl"], "part of the run directory"),
    (OTHER_RUN, [*PLAN, "--out", "{ws}/run_a/checkpoints/plan.json"], "part of the run directory"),
    (OTHER_RUN, [*TRAIN, "actor_config.save={ws}/run_b/checkpoints"], "another run's checkpoints"),
    (OTHER_RUN, [*TRAIN, "actor_config.save={ws}/ckpt_elsewhere"], "holds another run's checkpoints"),
    (OTHER_RUN, [*TRAIN[:-1], "trainer.run_dir={ws}/run_a/checkpoints/x"], "inside the run directory"),
    (OTHER_RUN, ["init-model", "--force", "--out", "{ws}/run_a"], "is a run directory"),
    (FOREIGN_FOLDER, ["sft", CONFIG, "--out", "{ws}/user_models", "sft.steps=1"], "notes.txt"),
    (FOREIGN_FOLDER, ["init-model", "--force", "--out", "{ws}/user_models"], "notes.txt"),
    (CORRUPT, [*TRAIN, "model.path={ws}/no_model_type"], "no model_type"),
    (CORRUPT, [*TRAIN, "model.path={ws}/str_hidden"], "hidden_size is '64'"),
    (CORRUPT, ["sft", CONFIG, "model.path={ws}/str_hidden", "sft.steps=1"], "hidden_size is '64'"),
    (CORRUPT, [*TRAIN, "model.path={ws}/truncated_weights"], "model.safetensors"),
    (CORRUPT, [*TRAIN, "actor_config.load={ws}/ckpt_no_step"], "no 'step'"),
    (CORRUPT, ["report", "{ws}/run_csv"], "not a JSON line"),
    (LIMIT, [*IMPORT, "{ws}/huge.yaml", "--out", "{ws}/o.yaml"], "too large"),
    (LIMIT, ["check", "--config", "{ws}/huge.yaml"], "too large"),
    (LIMIT, [*SIM, "--iterations", "1000000"], "--iterations"),
    (LIMIT, ["check", CONFIG, "--nodes", "1000000", "--no-sim"], "--nodes"),
    (MESSAGE, ["check", "--config", "{ws}/tab.yaml"], "tab.yaml:3:1: a tab character"),
    (MESSAGE, ["check", "--config", "{ws}/dup.yaml"], "dup.yaml:4:1: duplicate key"),
    (MESSAGE, ["check", CONFIG, "--no-sim", "trainer.run_dri=x"], "did you mean 'trainer.run_dir'"),
    (MESSAGE, ["check", CONFIG, "rl_config.max_lag=1", "--no-sim", "rl_config.max_lag=abc"],
     "override 'rl_config.max_lag=abc'"),
    (MESSAGE, ["tran"], "did you mean 'train'"),
    (MESSAGE, [*IMPORT, "{ws}", "--out", "{ws}/o.yaml"], "is a directory"),
    (MESSAGE, [*IMPORT, "{ws}/ours.yaml", "--out", "{ws}/o.yaml"], "is an asp-npu config"),
    (MESSAGE, ["bench", "real", CONFIG, "--modes", "asp", "--seeds", "1,1", "--out-dir", "{ws}/bench_new",
               *SMALL], "seed 1 is given twice"),
    (MESSAGE, [*PLAN[:-1], "64"], "larger than epoch 2"),
]


def _run_dir(folder: Path) -> None:
    (folder / "checkpoints" / "iter_0000002").mkdir(parents=True)
    (folder / "config.yaml").write_text("old: 1\n")
    (folder / ".asp-npu-run").write_text("asp-npu run directory\n")
    (folder / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    (folder / "summary.json").write_text('{"mode": "asp"}')
    (folder / "checkpoints" / "latest.json").write_text('{"iteration": "iter_0000002"}')


def _model(ws: Path, name: str, tiny: Path, **config: object) -> Path:
    out = ws / name
    shutil.copytree(tiny, out)
    cfg = json.loads((out / "config.json").read_text())
    for k, v in config.items():
        if v is ...:
            cfg.pop(k)
        else:
            cfg[k] = v
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    ws = tmp_path_factory.mktemp("guard")
    (ws / "t.jsonl").write_bytes(GOOD_TRACE)
    shutil.copy(MS, ws / "ms.yaml")
    shutil.copy(REPO / "configs" / "cpu_tiny.yaml", ws / "ours.yaml")
    for name in ("run_a", "run_b"):
        _run_dir(ws / name)
    (ws / "run_csv").mkdir()
    (ws / "run_csv" / "metrics.jsonl").write_text("step,reward\n1,0.5\n2,0.6\n")
    (ws / "ckpt_elsewhere" / "iter_0000004").mkdir(parents=True)
    (ws / "ckpt_elsewhere" / "latest.json").write_text('{"iteration": "iter_0000004"}')
    (ws / "user_models" / "qwen").mkdir(parents=True)
    (ws / "user_models" / "notes.txt").write_text("mine")
    _model(ws, "model", tiny_model_dir)
    _model(ws, "no_model_type", tiny_model_dir, model_type=...)
    _model(ws, "str_hidden", tiny_model_dir, hidden_size="64")
    weights = _model(ws, "truncated_weights", tiny_model_dir) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    ck = ws / "ckpt_no_step"
    (ck / "iter_0000002").mkdir(parents=True)
    (ck / "iter_0000002" / "trainer.json").write_text(json.dumps(
        {"schema": "asp-trainer-ckpt/3", "iteration": "iter_0000002", "policy_version": 1,
         "layout": {"tp": 1, "pp": 1, "dp": 1}, "use_distributed_optimizer": True}))
    (ck / "latest.json").write_text('{"iteration": "iter_0000002"}')
    (ws / "huge.yaml").write_text("a:\n" + "  k: 1\n" * 300_000)
    (ws / "tab.yaml").write_text("model:\n  path: x\n\tsize: tiny\n")
    (ws / "dup.yaml").write_text("model:\n  path: x\ndata:\nmodel:\n  size: tiny\n")
    return ws


def _snapshot(folder: Path) -> list[tuple[str, bytes]]:
    return sorted((str(p.relative_to(folder)), p.read_bytes() if p.is_file() else b"")
                  for p in folder.rglob("*"))


@pytest.mark.parametrize(("klass", "command", "expected"), CASES,
                         ids=[f"{i:02d}-{c[1][0]}" for i, c in enumerate(CASES)])
def test_refused_in_one_line_and_nothing_changed(ws: Path, klass: str, command: list[str],
                                                 expected: str) -> None:
    argv = [a.format(ws=ws, repo=REPO, wsname=ws.name) for a in command]
    before = _snapshot(ws)
    res = run_cli(argv, ws)
    err = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2, (klass, argv, res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    if argv[0] != "check":
        assert len(err) == 1, err
    assert any(expected in line for line in err), (expected, err)
    assert _snapshot(ws) == before, f"{argv} changed the workspace"


# ------------------------------------------------------------------- fuzz: truncate / corrupt each file

def _offsets(n: int) -> list[int]:
    return sorted({0, 1, 7, 8, 9, n // 3, n // 2, max(0, n - 3)})


def _damaged(data: bytes) -> list[tuple[str, bytes]]:
    """Truncations at several offsets and a byte made invalid (0xFF) at several offsets."""
    body = len(data.rstrip())  # a JSON text cut anywhere before its last character is torn
    out = [(f"cut@{k}", data[:k]) for k in _offsets(body) if k < body]
    out += [(f"ff@{k}", data[:k] + b"\xff" + data[k + 1:]) for k in _offsets(body) if k < body]
    return out


MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _safetensors_structural(data: bytes) -> int:
    return 8 + int.from_bytes(data[:8], "little")


@pytest.mark.parametrize("name", MODEL_FILES)
def test_fuzzed_model_folder_is_named_in_one_line(tmp_path: Path, tiny_model_dir: Path, name: str) -> None:
    from asp_npu.data.init_model import check_model_dir

    original = (tiny_model_dir / name).read_bytes()
    cases = _damaged(original)
    if name.endswith(".safetensors"):  # a byte of the weights themselves is a different model, not a torn one
        head = _safetensors_structural(original)
        cases = [(c, d) for c, d in cases if c.startswith("cut") or int(c.split("@")[1]) < head]
        cases += [(f"cut@{k}", original[:k]) for k in (head, head + 5, len(original) - 1)]
        cases.append(("padded", original + b"\0" * 16))
    folder = tmp_path / "m"
    shutil.copytree(tiny_model_dir, folder)
    for label, data in cases:
        (folder / name).write_bytes(data)
        with pytest.raises(UserError) as info:
            check_model_dir(folder)
        msg = str(info.value)
        assert "\n" not in msg and name in msg, (label, msg)
    (folder / name).write_bytes(original)
    check_model_dir(folder)


def _checkpoint(root: Path) -> Path:
    it = root / "iter_0000002"
    it.mkdir(parents=True)
    meta = {"schema": "asp-trainer-ckpt/3", "iteration": it.name, "step": 2, "policy_version": 1,
            "layout": {"tp": 1, "pp": 1, "dp": 1, "cp": 1}, "model_path": "m",
            "use_distributed_optimizer": True}
    (it / "trainer.json").write_text(json.dumps(meta, indent=1) + "\n")
    (root / "latest.json").write_text(json.dumps(meta) + "\n")
    return root


@pytest.mark.parametrize("name", ["latest.json", "iter_0000002/trainer.json"])
def test_fuzzed_checkpoint_metadata_is_named_in_one_line(tmp_path: Path, name: str) -> None:
    from asp_npu.trainer.checkpoint import read_meta

    root = _checkpoint(tmp_path / "ckpt")
    original = (root / name).read_bytes()
    for label, data in _damaged(original):
        (root / name).write_bytes(data)
        with pytest.raises(UserError) as info:
            read_meta(root)
        assert "\n" not in str(info.value), (label, str(info.value))
    (root / name).write_bytes(original)
    assert read_meta(root)["step"] == 2


@pytest.mark.parametrize("field", ["step", "policy_version", "layout", "iteration",
                                   "use_distributed_optimizer"])
@pytest.mark.parametrize("value", [..., "2", -1, None, 2.5, True])
def test_checkpoint_metadata_schema(tmp_path: Path, field: str, value: object) -> None:
    from asp_npu.trainer.checkpoint import read_meta

    root = _checkpoint(tmp_path / "ckpt")
    meta = json.loads((root / "iter_0000002" / "trainer.json").read_text())
    if value is ...:
        meta.pop(field)
    else:
        meta[field] = value
    if (field == "use_distributed_optimizer" and value is True) or (
            value is ... and field not in ("step", "iteration")):
        return  # a valid value, or an optional field left out
    (root / "iter_0000002" / "trainer.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="trainer.json"):
        read_meta(root)


RUN_FILES = {"summary.json": b'{"mode": "asp", "max_lag": 1, "throughput_tokens_per_s": 10.0}\n',
             "metrics.jsonl": b'{"step": 1, "reward/mean": 0.5}\n{"step": 2, "reward/mean": 0.6}\n',
             "queue.jsonl": b'{"t": 0.5, "occupancy": 3}\n{"t": 1.0, "occupancy": 2}\n'}


@pytest.mark.parametrize("name", sorted(RUN_FILES))
def test_fuzzed_run_dir_is_named_in_one_line(tmp_path: Path, name: str) -> None:
    """Via the CLI: exit 2 and one line, except a streamed log cut short: that is what a killed run
    leaves (its torn last row is skipped by design), so the report is drawn from the rows before it."""
    run = tmp_path / "run"
    run.mkdir()
    for n, data in RUN_FILES.items():
        (run / n).write_bytes(data)
    original = RUN_FILES[name]
    cases = _damaged(original)[::2]  # every other case: each is a subprocess
    for label, data in cases:
        (run / name).write_bytes(data)
        res = run_cli(["report", str(run), "--out", str(tmp_path / "r.png")], tmp_path)
        err = [line for line in res.stderr.splitlines() if line.strip()]
        torn_tail = name.endswith(".jsonl") and label.startswith("cut")  # a cut log ends in a torn line
        assert "Traceback" not in res.stderr, (label, res.stderr[-2000:])
        if torn_tail:
            assert res.returncode in (0, 2), (label, res.stderr)
        else:
            assert res.returncode == 2 and len(err) == 1 and name in err[0], (label, err)
