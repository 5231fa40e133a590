"""The one place that knows whether we run on CPU, Ascend NPU or CUDA.

Everything device-specific (distributed backend, Ray resource names, visible-device variables,
what must be imported before megatron-core or vLLM) is answered here, so the rest of the code
never branches on the device kind. NPU packages (torch_npu, mindspeed, vllm_ascend) are imported
only when present and asked for; this module imports nothing heavy at import time.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Literal

DeviceKind = Literal["cpu", "npu", "cuda"]


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def detect(requested: str = "auto") -> DeviceKind:
    """Resolve `auto` to the best usable device; an explicit request is validated, not guessed."""
    if requested not in ("auto", "cpu", "npu", "cuda"):
        raise ValueError(f"unknown device '{requested}'")
    if requested == "cpu":
        return "cpu"
    if requested in ("auto", "npu") and _has("torch_npu"):
        import torch
        import torch_npu  # noqa: F401  (registers the 'npu' device with torch)

        if torch.npu.is_available():  # type: ignore[attr-defined]
            return "npu"
    if requested == "npu":
        raise RuntimeError("device 'npu' requested but torch_npu is not installed or no NPU is usable")
    if requested in ("auto", "cuda"):
        import torch

        if torch.cuda.is_available():
            return "cuda"
    if requested == "cuda":
        raise RuntimeError("device 'cuda' requested but no CUDA device is usable")
    return "cpu"


@dataclass(frozen=True)
class DeviceSpec:
    kind: DeviceKind
    dist_backend: str  # torch.distributed backend
    ray_resource: str | None  # custom Ray resource per device (None on CPU: use num_cpus)
    visible_devices_env: str | None  # env var that pins a process to its devices
    torch_device: str


SPECS: dict[str, DeviceSpec] = {
    "cpu": DeviceSpec("cpu", "gloo", None, None, "cpu"),
    "npu": DeviceSpec("npu", "hccl", "NPU", "ASCEND_RT_VISIBLE_DEVICES", "npu"),
    "cuda": DeviceSpec("cuda", "nccl", "GPU", "CUDA_VISIBLE_DEVICES", "cuda"),
}


def spec(kind: DeviceKind) -> DeviceSpec:
    return SPECS[kind]


def prepare_megatron(kind: DeviceKind) -> None:
    """Imports that must happen before megatron-core: MindSpeed's adaptor on NPU, the CPU shim on CPU."""
    if kind == "npu":
        import torch  # noqa: F401
        import torch_npu  # noqa: F401
        import mindspeed.megatron_adaptor  # noqa: F401
    elif kind == "cpu":
        from asp_npu.trainer import cpu_compat

        cpu_compat.install()


def loopback_env() -> dict[str, str]:
    """Environment that keeps Ray, gloo and vLLM on 127.0.0.1 in single-machine CPU mode."""
    return {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "MASTER_ADDR": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": "lo",
        "VLLM_HOST_IP": "127.0.0.1",
    }


def rollout_env(kind: DeviceKind, devices: list[int], kv_cache_gib: float) -> dict[str, str]:
    """Environment for one rollout instance pinned to `devices` (CPU cores on CPU, cards elsewhere)."""
    if kind == "cpu":
        return {
            "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(d) for d in devices),
            "VLLM_CPU_KVCACHE_SPACE": str(max(1, round(kv_cache_gib))),
            "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        }
    env = {spec(kind).visible_devices_env: ",".join(str(d) for d in devices)}  # type: ignore[dict-item]
    if kind == "npu":
        env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] = "1"
    return env


def available_devices(kind: DeviceKind) -> int:
    """How many devices of this kind this node offers (CPU: usable cores)."""
    if kind == "cpu":
        return len(os.sched_getaffinity(0))
    if kind == "npu":
        import torch
        import torch_npu  # noqa: F401

        return int(torch.npu.device_count())  # type: ignore[attr-defined]
    import torch

    return int(torch.cuda.device_count())
