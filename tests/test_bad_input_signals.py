"""SIGTERM during `asp-npu train`'s start-up (issue 30): at three points (before Ray, while the rollout
engines start, while the trainer group forms) the command exits 143 with one line, no process it
started is left, and the run folder is as it was (a previous run's files put back, no new one made).

Each signal point is reached by what the command does, never by a timer: the progress line `train`
prints once the config, data and model folder are checked and the run folder is prepared, just
before it starts Ray ("before-ray"), or the first process of a kind appearing under the command.
Each case is one real start (Ray, vLLM, megatron over gloo) cut short: slow, and kept to three.
tests/test_signals_commands.py does the same for `bench real`, `calibrate` and `sft` with these helpers.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import psutil
import pytest

from tests.test_bad_input_commands import REPO, SMALL

START_LIMIT_S = 300  # to reach a signal point on a busy 2-core machine
EXIT_LIMIT_S = 60  # from the signal to the command's exit
BEFORE_RAY = "; starting Ray"  # the end of train's progress line once its checks pass (pipeline/train.py)
RAY = ("gcs_server", "raylet", "ray::")

# point -> what marks it: a stderr line ("line:<text>") or a process title under the command
POINTS = {"before-ray": f"line:{BEFORE_RAY}", "engines-starting": "ray::RolloutInstance",
          "trainer-forming": "ray::TrainerRank"}
ENV = {"PYTHONPATH": str(REPO), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "RAY_USAGE_STATS_ENABLED": "0",
       "VLLM_HOST_IP": "127.0.0.1", "MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
       "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "TOKENIZERS_PARALLELISM": "false"}


def _title(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


class Command:
    """One `asp-npu` command in its own session; its stdout and stderr are read as they come (so a
    chatty engine never blocks on a full pipe) and every process seen under it is remembered."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "asp_npu.cli", *args], cwd=cwd,
                                     env={**os.environ, **ENV}, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.driver = psutil.Process(self.proc.pid)
        self.seen: dict[int, psutil.Process] = {}
        self.err: list[str] = []
        self.lines: queue.Queue[str] = queue.Queue()
        self._readers = [threading.Thread(target=self._read, args=(s, keep), daemon=True)
                         for s, keep in ((self.proc.stdout, False), (self.proc.stderr, True))]
        for t in self._readers:
            t.start()

    def _read(self, stream: IO[str] | None, keep: bool) -> None:
        for line in stream or ():
            if keep:
                self.err.append(line)
                self.lines.put(line)

    def kids(self) -> list[psutil.Process]:
        try:
            kids = self.driver.children(recursive=True)
        except psutil.Error:
            return []
        self.seen.update({p.pid: p for p in kids})
        return kids

    def stderr(self, tail: int = 3000) -> str:
        return "".join(self.err)[-tail:]

    def wait_for(self, point: str, limit_s: float = START_LIMIT_S) -> None:
        """Until `point` ("line:<text>" on stderr, else a process title under the command) is reached;
        fails the test if the command ends or the limit passes first."""
        t0 = time.time()
        while time.time() - t0 < limit_s and self.proc.poll() is None:
            if point.startswith("line:"):
                try:
                    if point[5:] in self.lines.get(timeout=0.5):
                        return
                except queue.Empty:
                    pass
                continue
            if any(point in _title(p) for p in self.kids()):
                return
            time.sleep(0.2)
        self.kill()
        pytest.fail(f"the command ended or took over {limit_s}s before {point}: {self.stderr()}")

    def interrupt(self, sig: int = signal.SIGTERM, group: bool = False) -> int:
        """Send `sig` now (`group`: to the command's whole process group, as Ctrl-C in a terminal does);
        the exit status once the command has ended (killed after EXIT_LIMIT_S)."""
        self.kids()
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=EXIT_LIMIT_S)
        finally:
            self.kill()
        for t in self._readers:
            t.join(timeout=10)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def left(self) -> list[str]:
        """Processes the command started that are still alive (after a moment for them to go)."""
        time.sleep(2)
        return [_title(p) for p in self.seen.values()
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def own_tracebacks(err: list[str]) -> list[str]:
    """Tracebacks in the command's stderr that run through asp-npu's code: not those a Python child it
    started prints under its own header ("Process EngineCore:"), nor a child interpreter's cut short
    while it starts (frames of its own start-up only): a group's Ctrl-C reaches them too."""
    def child(header: str) -> bool:
        return header.startswith("Process ") and header.rstrip().endswith(":")

    own = []
    for i, line in enumerate(err):
        if not line.startswith("Traceback") or (i and child(err[i - 1])):
            continue
        frames = []
        for nxt in err[i + 1:]:
            if not nxt.startswith(" "):
                break
            frames.append(nxt)
        if any("asp_npu" in f for f in frames):
            own.append(line)
    return own


def assert_interrupted(cmd: Command, name: str, rc: int, sig: int = signal.SIGTERM) -> None:
    """Exit 128 + sig, no traceback of its own, its last own line says so, nothing of it left."""
    err = cmd.stderr()
    lines = [line for line in "".join(cmd.err).splitlines() if line.startswith("asp-npu")]
    assert rc == 128 + sig, err
    assert own_tracebacks(cmd.err) == [], err
    assert lines and lines[-1].startswith(f"asp-npu {name}: interrupted by {signal.Signals(sig).name}"), err
    assert cmd.left() == []


def previous_run(folder: Path) -> None:
    folder.mkdir()
    (folder / "config.yaml").write_text("old: 1\n")
    (folder / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    (folder / "notes.txt").write_text("the user's own file\n")


def snapshot(folder: Path) -> list[tuple[str, bytes]]:
    return sorted((str(p.relative_to(folder)), p.read_bytes() if p.is_file() else b"")
                  for p in folder.rglob("*"))


@pytest.mark.slow
@pytest.mark.parametrize("point", list(POINTS))
def test_sigterm_during_start_up_leaves_nothing(tmp_path: Path, tiny_model_dir: Path, point: str) -> None:
    run = tmp_path / "run"
    previous_run(run)
    before = snapshot(run)
    cmd = Command(["train", f"--config={REPO}/configs/cpu_tiny.yaml", *SMALL, f"model.path={tiny_model_dir}",
                   f"trainer.run_dir={run}", "trainer.train_iters=2"], tmp_path)
    cmd.wait_for(POINTS[point])
    if point == "before-ray":  # the line comes before ray.init: no Ray process is up yet
        assert not [t for t in map(_title, cmd.kids()) if any(r in t for r in RAY)], cmd.stderr()
    rc = cmd.interrupt(signal.SIGTERM)
    assert_interrupted(cmd, "train", rc)
    assert snapshot(run) == before
