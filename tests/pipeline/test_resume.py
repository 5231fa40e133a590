"""Exact resume and trainer failure with the real engines and trainer, through `asp-npu train`.

One run goes through both stops (each start of the pipeline is most of this file's cost):
1. SIGTERM to the driver mid-run: it finishes the trainer step in flight, checkpoints (trainer shards +
   the pipeline's state) and exits 143 with one line naming the checkpoint; the same command with
   `actor_config.load` resumes; the restored predictor predicts what it did at the stop.
2. In the resumed run, once it wrote a checkpoint of its own, the trainer rank's process is killed
   (SIGKILL): the run stops cleanly, starts again from that checkpoint (`trainer.max_restarts`, default
   1) and completes.
The run's ledger of consumed group ids is then the uninterrupted run's (every group of every planned
window, none twice, the pre-stop ledger as its prefix), and samples.jsonl / metrics.jsonl hold every
group and step once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asp_npu.config import load_config
from asp_npu.core import run_dir as rd
from asp_npu.core.window import window_stream
from asp_npu.pipeline.recorder import RUN_LOG
from tests.pipeline.test_e2e import OVERRIDES

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

ITERS, WINDOW, STEPS_PER_WINDOW = 4, 6, 3  # 6 prompts x 4 samples per window, minibatches of 8 samples
ARGS = [*OVERRIDES, "generate_config.num_instances=1", f"trainer.train_iters={ITERS}",
        "trainer.logger=[jsonl]"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from asp_npu.data.init_model import build_model_dir

    return build_model_dir(tmp_path_factory.mktemp("resume") / "tiny", "tiny", seed=0)


def _start(model: Path, run: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "asp_npu.cli", "train", "--config", "configs/cpu_tiny.yaml", *ARGS,
           f"model.path={model}", f"trainer.run_dir={run}", *extra]
    log = open(run.parent / f"{run.name}.{len(list(run.parent.glob(run.name + '.*.log')))}.log", "w")  # noqa: SIM115
    # a new local Ray, never a cluster `ray start` left running; its workers import this checkout's code
    env = {**os.environ, "RAY_ADDRESS": "local",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def _steps(run: Path) -> int:
    p = run / rd.SAMPLES
    return len(p.read_text().splitlines()) // 8 if p.is_file() else 0


def _wait_for(cond, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert proc.poll() is None, f"the run ended early (rc {proc.returncode})"
        assert time.time() < deadline, "timed out"
        time.sleep(0.2)


def _planned_ids(model: Path) -> list[str]:
    from asp_npu.data.datasets import config_prompts

    cfg = load_config("configs/cpu_tiny.yaml", [*ARGS, f"model.path={model}"])
    items = window_stream(config_prompts(cfg.data), WINDOW, cfg.data.seed)
    return [it.prompt_id for w in range(ITERS) for it in items(w)]


def _last_log_line(run: Path) -> str:
    logs = sorted(run.parent.glob(run.name + ".*.log"))
    lines = [ln for ln in logs[-1].read_text().splitlines() if ln.startswith("asp-npu: ")]
    return lines[-1] if lines else ""


def test_sigterm_then_a_killed_trainer_rank_and_the_run_consumes_what_the_uninterrupted_run_would(
    model, tmp_path
):
    from asp_npu.pipeline.resume import load_state
    from asp_npu.predict.factory import make_predictor
    from asp_npu.trainer.checkpoint import read_meta

    run = tmp_path / "run"
    run.mkdir()
    proc = _start(model, run, "trainer.save_freq=0")
    _wait_for(lambda: _steps(run) >= STEPS_PER_WINDOW + 1, 600, proc)  # inside the second window
    t_sig = time.time()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(600)
    stop_s = time.time() - t_sig
    line = _last_log_line(run)
    assert rc == 128 + signal.SIGTERM, line
    assert "stopped by SIGTERM" in line and "actor_config.load=" in line, line
    root = line.rsplit("actor_config.load=", 1)[1].strip()
    state = load_state(root)
    assert state is not None and 0 < state.step < ITERS * STEPS_PER_WINDOW - 2
    before = list(state.consumed_ids)
    assert len(before) == state.consumed == state.step * 2  # 2 groups per trainer step
    pred = make_predictor("history")
    pred.load_state_dict(state.predictor)
    ids, plens, probe = state.probe
    assert ids and list(pred.predict_many(ids, plens).mean) == probe

    t_res = time.time()
    proc = _start(model, run, "trainer.save_freq=2", f"actor_config.load={root}")
    _wait_for(lambda: read_meta(root)["step"] > state.step, 600, proc)  # the resumed run's own checkpoint
    pids = _trainer_pids(proc.pid)
    assert pids, "no trainer rank process found"
    t_kill = time.time()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    assert proc.wait(900) == 0, _last_log_line(run)
    resumed_s, after_kill_s = time.time() - t_res, time.time() - t_kill

    summary = json.loads((run / rd.SUMMARY).read_text())
    got = summary["consumed_group_ids"]
    planned = _planned_ids(model)
    assert summary["steps"] == ITERS * STEPS_PER_WINDOW
    assert got[:len(before)] == before
    assert len(got) == len(set(got)) == len(planned) and sorted(got) == sorted(planned)
    log = [json.loads(ln) for ln in (run / RUN_LOG).read_text().splitlines()]
    restored = next(r for r in log if r["event"] == "predictor_restored")
    assert restored["prompts"] > 0 and restored["max_abs_diff"] == 0.0
    resumed = [r for r in log if r["event"] == "resumed"]
    assert resumed[0]["step"] == state.step and resumed[0]["queued"] + resumed[0]["pending"] > 0
    restart = next(r for r in log if r["event"] == "trainer_restart")
    assert restart["who"].startswith("trainer rank") and restart["from"]
    assert len(resumed) == 2 and resumed[1]["step"] > state.step  # from the resumed run's checkpoint
    _assert_streams_whole(run, planned)
    print(f"\nresume: SIGTERM -> exit {rc} after {stop_s:.1f}s at step {state.step} "
          f"({len(before)} groups consumed, {len(state.queued)} queued, {len(state.pending)} pending); "
          f"trainer kill in the resumed run: stopped cleanly {restart['t_failed'] - t_kill:.1f}s after it "
          f"({restart['who']}: {restart['cause']}), resumed from step {resumed[1]['step']}, completed "
          f"{after_kill_s:.1f}s after the kill ({resumed_s:.1f}s after the resume); "
          f"consumed ids = the planned set: {sorted(got) == sorted(planned)}")


def _assert_streams_whole(run, planned) -> None:
    """samples.jsonl and metrics.jsonl hold the whole run across the stop: every planned group's samples
    once, every trainer step's metrics row once (the resumed run continued the files, nothing lost)."""
    rows = [json.loads(ln) for ln in (run / rd.SAMPLES).read_text().splitlines()]
    keys = [(r["prompt_id"], r["epoch"], r["sample_idx"]) for r in rows]
    assert len(keys) == len(set(keys)) == len(planned) * 4
    assert len({(r["prompt_id"], r["epoch"]) for r in rows}) == len(planned)
    steps = [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()
             if "final" not in json.loads(ln)]
    assert steps == list(range(1, ITERS * STEPS_PER_WINDOW + 1))


def _trainer_pids(root_pid: int) -> list[int]:
    import psutil

    out = []
    for p in psutil.Process(root_pid).children(recursive=True):
        try:
            if "TrainerRank" in " ".join(p.cmdline()) or "TrainerRank" in p.name():
                out.append(p.pid)
        except psutil.Error:
            continue
    return out
