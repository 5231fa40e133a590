"""A command watched from outside while it runs: every listening TCP socket of its process tree (to show
single-machine mode binds everything to 127.0.0.1) and its console (to show it keeps only the progress
line). Used by `tests/pipeline/test_e2e.py`'s resumed run."""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest


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


def watch(cmd: list[str], run: Path, timeout_s: float = 600) -> WatchedRun:
    """Run `cmd` (writing its run directory `run`) without the loopback settings `ci/test.sh`
    exports, so they must come from the code, and warnings not silenced; its console and every listening
    socket of its process tree, polled every 0.5 s."""
    if shutil.which("ss") is None:
        pytest.importorskip("psutil")
    ci_env = ("VLLM_HOST_IP", "MASTER_ADDR", "GLOO_SOCKET_IFNAME", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
              "PYTHONWARNINGS")
    env = {k: v for k, v in os.environ.items() if k not in ci_env}
    env["PYTHONPATH"] = str(Path.cwd())
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[tuple[str, int, str]] = set()
    deadline = time.time() + timeout_s
    try:
        while proc.poll() is None and time.time() < deadline:
            seen |= _listeners(_tree(proc.pid))
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
        output = proc.communicate()[0]
    return WatchedRun(run, proc.returncode, output, seen)


def assert_loopback_only(watched: WatchedRun) -> None:
    assert watched.listeners, "no listening socket seen: the probe did not work"
    outside = sorted(s for s in watched.listeners if not _is_loopback(s[0]))
    assert not outside, f"listening outside loopback (address, port, process): {outside}"


def assert_console_has_only_progress(watched: WatchedRun, instances: int) -> None:
    """The project's own one-line notices (e.g. which weight path runs) may name vLLM; nothing else may.
    Each instance's and trainer rank 0's output is in `logs/`."""
    noise = [line for line in watched.console.splitlines()
             if NOISE.search(line) and not line.startswith("asp-npu: ")]
    assert not noise, noise
    assert "step" in watched.console  # the progress line
    logs = watched.run / "logs"
    for i in range(instances):
        inst = (logs / f"instance-{i}.log").read_text()
        assert re.search(r"vllm|EngineCore", inst, re.IGNORECASE), inst[:2000]
    assert (logs / "trainer-rank0.log").read_text().strip(), "trainer rank 0 wrote nothing"
