"""SIGTERM during `asp-npu train`'s start-up (issue 30): at three points (before Ray, while the rollout
engines start, while the trainer group forms) the command exits 143 with one line, no process it
started is left, and the run folder is as it was (a previous run's files put back, no new one made).

Each case is one real start (Ray, vLLM, megatron over gloo) cut short: slow, and kept to three.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.test_bad_input_commands import REPO, SMALL

START_LIMIT_S = 300  # to reach a signal point on a busy 2-core machine
EXIT_LIMIT_S = 60  # from the signal to the command's exit

# point -> what must be running when the signal is sent (None: only the driver, before Ray)
POINTS = {"before-ray": None, "engines-starting": "ray::RolloutInstance",
          "trainer-forming": "ray::TrainerRank"}


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def _title(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _previous_run(folder: Path) -> None:
    folder.mkdir()
    (folder / "config.yaml").write_text("old: 1\n")
    (folder / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    (folder / "notes.txt").write_text("the user's own file\n")


def _snapshot(folder: Path) -> list[tuple[str, bytes]]:
    return sorted((str(p.relative_to(folder)), p.read_bytes() if p.is_file() else b"")
                  for p in folder.rglob("*"))


@pytest.mark.slow
@pytest.mark.parametrize("point", list(POINTS))
def test_sigterm_during_start_up_leaves_nothing(tmp_path: Path, tiny_model_dir: Path, point: str) -> None:
    run = tmp_path / "run"
    _previous_run(run)
    before = _snapshot(run)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
           "RAY_USAGE_STATS_ENABLED": "0", "VLLM_HOST_IP": "127.0.0.1", "MASTER_ADDR": "127.0.0.1",
           "GLOO_SOCKET_IFNAME": "lo"}
    argv = [sys.executable, "-m", "asp_npu.cli", "train", f"--config={REPO}/configs/cpu_tiny.yaml", *SMALL,
            f"model.path={tiny_model_dir}", f"trainer.run_dir={run}", "trainer.train_iters=2"]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    driver = psutil.Process(proc.pid)
    seen: dict[int, psutil.Process] = {}
    want = POINTS[point]
    t0 = time.time()
    try:
        while time.time() - t0 < START_LIMIT_S and proc.poll() is None:
            kids = _tree(driver)
            seen.update({p.pid: p for p in kids})
            if want is None and time.time() - t0 > 3.0:
                assert not kids, [_title(p) for p in kids]  # still before Ray
                break
            if want is not None and any(want in _title(p) for p in kids):
                break
            time.sleep(0.2)
        if proc.poll() is not None:
            pytest.fail(f"the run ended before the signal point {point}: {proc.communicate()[1][-3000:]}")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=EXIT_LIMIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    lines = [line for line in err.splitlines() if line.startswith("asp-npu")]
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert lines and lines[-1].startswith("asp-npu train: interrupted by SIGTERM"), err[-2000:]
    time.sleep(2)
    left = [_title(p) for p in seen.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert left == [], left
    assert _snapshot(run) == before
