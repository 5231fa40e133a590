"""Per-actor logs: an actor's output (Python, C-level, child processes) lands in its own file, and a
training run's console keeps only the progress line while logs/ holds each instance's and rank's file
(that one on a real run: `tests/pipeline/test_e2e.py`, the resumed run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from asp_npu.observe.actor_log import LOG_ENV, log_path, with_log

CHILD = """
import logging, os, sys, warnings
from asp_npu.observe.actor_log import redirect
redirect()
print("python print")
logging.getLogger("vllm").warning("a logging warning")
warnings.warn("a python warning")
os.write(2, b"fd 2 write\\n")
os.system("echo from a child process")
"""


def test_with_log_keeps_the_actors_environment_and_adds_its_file(tmp_path):
    opts = {"num_cpus": 1, "runtime_env": {"env_vars": {"A": "1"}, "pip": []}}
    out = with_log(opts, tmp_path / "x.log")
    assert out["runtime_env"] == {"env_vars": {"A": "1", LOG_ENV: str(tmp_path / "x.log")}, "pip": []}
    assert opts["runtime_env"]["env_vars"] == {"A": "1"}  # the caller's options are not changed
    assert log_path("runs/r", "instance-0") == Path("runs/r").resolve() / "logs" / "instance-0.log"


def test_redirect_sends_every_kind_of_output_to_the_file_and_appends(tmp_path):
    target = tmp_path / "logs" / "instance-0.log"
    env = {**os.environ, LOG_ENV: str(target), "PYTHONPATH": os.getcwd()}
    for _ in range(2):  # a restarted actor appends
        done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout == done.stderr == ""
    text = target.read_text()
    for line in ("python print", "a logging warning", "a python warning", "fd 2 write",
                 "from a child process"):
        assert text.count(line) == 2, (line, text)


def test_redirect_without_a_file_changes_nothing():
    env = {k: v for k, v in os.environ.items() if k != LOG_ENV}
    done = subprocess.run([sys.executable, "-c", CHILD], env={**env, "PYTHONPATH": os.getcwd()},
                          capture_output=True, text=True, timeout=120)
    assert "python print" in done.stdout and "fd 2 write" in done.stderr
