"""One short `asp-npu train` run, watched from outside: single-machine mode binds everything to
127.0.0.1 (its process tree -- Ray, vLLM instances, trainer ranks, the rendezvous store, gloo -- never
listens outside 127.0.0.0/8), and its console keeps only the progress line while `logs/` holds each
instance's and rank's output. One run serves both: a train run is most of this file's cost."""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.pipeline.test_e2e import OVERRIDES

pytestmark = pytest.mark.slow


def _is_loopback(ip: str) -> bool:
    """ss writes `*` for a dual-stack socket on every interface; ::ffff:127.0.0.1 is loopback too."""
    if ip == "*":
        return False
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def _tree(pid: int) -> set[int]:
    """`pid` and all its descendants, from /proc (parent of each process)."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(text.rsplit(")", 1)[1].split()[1])
    tree, grew = {pid}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in tree} - tree
        tree |= more
        grew = bool(more)
    return tree


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:100]
    except OSError:
        return "?"


def _listeners(pids: set[int]) -> set[tuple[str, int, str]]:
    """(address, port, command line) of each listening TCP socket of `pids`: `ss -ltnp`, else psutil."""
    if shutil.which("ss") is None:
        import psutil

        return {(c.laddr.ip, c.laddr.port, _cmdline(c.pid)) for c in psutil.net_connections("tcp")
                if c.status == psutil.CONN_LISTEN and c.pid in pids}
    out = subprocess.run(["ss", "-H", "-ltnp"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 6:
            continue
        local, users = parts[3], " ".join(parts[5:])
        addr, _, port = local.rpartition(":")
        owners = {int(p.split("=")[1]) for p in users.replace(")", ",").split(",") if p.startswith("pid=")}
        for pid in owners & pids:
            found.add((addr.strip("[]"), int(port), _cmdline(pid)))
    return found


NOISE = re.compile(r"vllm|megatron|EngineCore|RolloutInstance|TrainerRank|RotaryEmbedding|WARNING|Warning|"
                   r"Traceback|safetensors|gloo", re.IGNORECASE)


@dataclass
class WatchedRun:
    run: Path
    returncode: int
    console: str
    listeners: set[tuple[str, int, str]]


@pytest.fixture(scope="module")
def watched(tmp_path_factory) -> WatchedRun:
    """The run, its console (stdout and stderr) and every listening socket of its process tree."""
    if shutil.which("ss") is None:
        pytest.importorskip("psutil")
    from asp_npu.data.init_model import build_model_dir

    root = tmp_path_factory.mktemp("watched")
    model = build_model_dir(root / "tiny", "tiny", seed=0)
    # the loopback settings must come from the code, not from ci/test.sh; warnings are not silenced
    ci_env = ("VLLM_HOST_IP", "MASTER_ADDR", "GLOO_SOCKET_IFNAME", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
              "PYTHONWARNINGS")
    env = {k: v for k, v in os.environ.items() if k not in ci_env}
    env["PYTHONPATH"] = str(Path.cwd())
    cmd = [sys.executable, "-m", "asp_npu.cli", "train", "--config", "configs/cpu_tiny.yaml",
           f"model.path={model}", f"trainer.run_dir={root / 'run'}", "trainer.train_iters=1",
           *OVERRIDES, "generate_config.num_instances=1", "trainer.logger=[console,jsonl]"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[tuple[str, int, str]] = set()
    deadline = time.time() + 600
    try:
        while proc.poll() is None and time.time() < deadline:
            seen |= _listeners(_tree(proc.pid))
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
        output = proc.communicate()[0]
    return WatchedRun(root / "run", proc.returncode, output, seen)


def test_train_run_listens_on_loopback_only(watched):
    assert watched.returncode == 0, watched.console[-3000:]
    assert watched.listeners, "no listening socket seen: the probe did not work"
    outside = sorted(s for s in watched.listeners if not _is_loopback(s[0]))
    assert not outside, f"listening outside loopback (address, port, process): {outside}"


def test_a_train_runs_console_has_only_progress_and_each_actor_has_its_log(watched):
    assert watched.returncode == 0, watched.console[-3000:]
    # the project's own one-line notices (e.g. which weight path runs) may name vLLM; nothing else may
    noise = [line for line in watched.console.splitlines()
             if NOISE.search(line) and not line.startswith("asp-npu: ")]
    assert not noise, noise
    assert "step" in watched.console  # the progress line
    logs = watched.run / "logs"
    inst, rank = (logs / "instance-0.log").read_text(), (logs / "trainer-rank0.log").read_text()
    assert re.search(r"vllm|EngineCore", inst, re.IGNORECASE), inst[:2000]
    assert rank.strip(), "trainer rank 0 wrote nothing"
