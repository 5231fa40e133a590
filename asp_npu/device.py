"""The one place that knows whether we run on CPU, Ascend NPU or CUDA.

Everything device-specific (distributed backend, Ray resource names, visible-device variables,
what must be imported before megatron-core or vLLM) is answered here, so the rest of the code
never branches on the device kind. NPU packages (torch_npu, mindspeed, vllm_ascend) are imported
only when present and asked for; this module imports nothing heavy at import time.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
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

        if torch.npu.is_available():
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
    # context parallelism: asp-npu's all-gather core attention (megatron-core's local attention refuses
    # CP without Transformer Engine), or False where the stack attends across CP chunks itself
    # (MindSpeed's adaptor on Ascend: ring attention over the same 2 x CP chunks, flash-attention memory)
    cp_gather_attention: bool = True
    # packed micro-batches (actor_config.use_remove_padding): True where asp-npu's core attention runs the
    # packed stream sequence by sequence (megatron's local attention refuses packed_seq_params without
    # Transformer Engine), False where the stack's own attention takes cu_seqlens (MindSpeed's
    # variable-length flash attention on Ascend)
    packed_split_attention: bool = True
    # CPU: a core is a logical device that rollout and trainer may share (disjoint cards elsewhere)
    shared_cores: bool = False
    unit: str = "devices"  # what the run's devices are called in messages


SPECS: dict[str, DeviceSpec] = {
    "cpu": DeviceSpec("cpu", "gloo", None, None, "cpu", shared_cores=True, unit="cores"),
    "npu": DeviceSpec("npu", "hccl", "NPU", "ASCEND_RT_VISIBLE_DEVICES", "npu", cp_gather_attention=False,
                      packed_split_attention=False, unit="npu devices"),
    "cuda": DeviceSpec("cuda", "nccl", "GPU", "CUDA_VISIBLE_DEVICES", "cuda", unit="cuda devices"),
}
DEVICE_SETTINGS = ("auto", *SPECS)  # `trainer.device`


def spec(kind: DeviceKind) -> DeviceSpec:
    return SPECS[kind]


def kind_of(torch_device_type: str) -> DeviceKind:
    """The device kind of a torch device type (an unknown accelerator is driven like CUDA)."""
    return torch_device_type if torch_device_type in SPECS else "cuda"  # type: ignore[return-value]


def host_only(setting: str) -> bool:
    """`trainer.device` names the host CPU (a config that cannot run on an accelerator cluster)."""
    return setting == "cpu"


def pinnable(torch_device_type: str) -> bool:
    """Host copies of this device's tensors are pinned (a CPU tensor has no device to pin for)."""
    return torch_device_type != "cpu"


def prepare_megatron(kind: DeviceKind) -> None:
    """Imports that must happen before megatron-core on this device: MindSpeed's adaptor on NPU.

    On CPU the trainer also installs its own CUDA-to-CPU shim (`asp_npu.trainer.cpu_compat.prepare`);
    this module does not import it, because the device layer sits below the trainer.
    """
    if kind == "npu":
        # order matters: torch, then torch_npu, then MindSpeed's patches, all before megatron-core
        for module in ("torch", "torch_npu", "mindspeed.megatron_adaptor"):
            importlib.import_module(module)


def loopback_env() -> dict[str, str]:
    """Environment that keeps Ray, gloo and vLLM on 127.0.0.1 in single-machine CPU mode."""
    return {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "MASTER_ADDR": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": "lo",
        "VLLM_HOST_IP": "127.0.0.1",
    }


def init_ray(num_cpus: int, single_machine: bool = True, address: str = "", **kwargs: object) -> bool:
    """Start or join Ray for this process unless it is already connected; True when this call did.

    The one place the project connects to Ray. `address` (`trainer.ray_address`, else the RAY_ADDRESS
    environment variable): join that running cluster -- "auto" for the local one `ray start` made,
    or "host:port" of its head -- instead of starting a private one of `num_cpus` CPUs (a running
    cluster's nodes bring their own resources). On a single machine (`trainer.nnodes` 1 and no
    address, or an address on 127.0.0.1) it first puts `loopback_env()` in the environment (values the
    user set win), so the GCS, raylet and every actor -- trainer ranks, vLLM workers, gloo -- stay on
    127.0.0.1.
    """
    address = address or os.environ.get("RAY_ADDRESS", "")
    if (single_machine and not address) or address.split(":")[0] in ("127.0.0.1", "localhost"):
        for k, v in loopback_env().items():  # before `import ray`: Ray reads them when imported
            os.environ.setdefault(k, v)
    import ray

    if ray.is_initialized():
        return False
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    kwargs.setdefault("include_dashboard", False)
    try:
        if address:
            kwargs.pop("include_dashboard")  # the cluster's head decides about its dashboard
            ray.init(address=address, **kwargs)
        else:  # "local": a private instance, never a cluster some `ray start` on this machine left behind
            ray.init(address="local", num_cpus=num_cpus, **kwargs)
    except SystemExit as exc:  # ray.init's own SIGTERM handler (sys.exit) while it ran: an interrupt
        if main and exc.code == signal.SIGTERM:
            from asp_npu import interrupt

            raise interrupt.record(signal.SIGTERM) from None
        raise
    finally:
        if main and callable(previous):  # ray.init put its own (sys.exit) SIGTERM handler in place
            signal.signal(signal.SIGTERM, previous)
    return True


def rollout_env(kind: DeviceKind, devices: list[int], kv_cache_gib: float) -> dict[str, str]:
    """Environment for one rollout instance pinned to `devices` (CPU cores on CPU, cards elsewhere)."""
    if kind == "cpu":
        return {
            "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(d) for d in devices),
            "VLLM_CPU_KVCACHE_SPACE": str(max(1, round(kv_cache_gib))),
            "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
            # One worker per CPU instance, so it runs inside the engine-core process (vLLM's uni
            # executor) instead of a third process: ~10 s less start-up per engine and the same
            # tokens/s (docs/BENCHMARKS.md, "CI time"). Its core binding: `engine_spawn_env`.
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        }
    env = visible_devices(kind, devices)
    if kind == "npu":
        env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] = "1"
        env["VLLM_ASCEND_ENABLE_NZ"] = "0"  # FRACTAL_NZ weights break repeated refreshes (vllm-ascend)
    return env


@contextmanager
def engine_spawn_env() -> Iterator[None]:
    """While the engine's own processes are spawned: on CPU with the uni executor (`rollout_env`) the
    worker runs in the engine-core process, so the OpenMP binding vLLM's mp executor would give its
    worker process is given to that one (its threads on the instance's cores). The process building
    the engine gets its own environment back."""
    cores = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "")
    extra = {}
    if cores and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
        extra = {"OMP_NUM_THREADS": str(len(cores.split(","))), "OMP_PLACES": "{" + cores + "}",
                 "OMP_PROC_BIND": "true"}
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


ROLLOUT_NICE_ENV = "ASP_ROLLOUT_NICE"
PIN_CORES_ENV = "ASP_PIN_CORES"


@dataclass(frozen=True)
class CpuPlacement:
    """The cores of each rollout instance and each trainer rank on a CPU node.

    `disjoint`: rollout and training own separate cores, the CPU form of a disaggregated cluster where
    the trainer owns its NPUs; every process is pinned, so neither slows the other. Otherwise they
    share the cores: colocated modes alternate (nothing overlaps), and an asynchronous mode that does
    not fit lowers the engines' priority (`rollout_nice`) so the trainer, its critical path, is not
    starved while rollout runs up to `max_lag` versions ahead.
    """

    instance_cores: tuple[tuple[int, ...], ...]
    trainer_cores: tuple[int, ...]
    disjoint: bool
    colocated: bool

    @property
    def rollout_nice(self) -> int:
        return 0 if self.disjoint or self.colocated else 10


def rank_cores(cores: list[int] | tuple[int, ...], rank: int, world: int) -> list[int]:
    """Trainer rank `rank`'s share of the trainer cores (ranks share cores when there are fewer)."""
    if len(cores) < world:
        return [cores[rank % len(cores)]]
    share = len(cores) // world
    return list(cores[rank * share:(rank + 1) * share])


def cpu_placement(cores: list[int], num_instances: int, cores_per_instance: int, trainer_world: int,
                  colocated: bool) -> CpuPlacement:
    """Disjoint cores for an asynchronous mode when rollout + trainer fit (the trainer gets every core
    the instances leave), else all cores shared; instances take consecutive cores round-robin."""
    rollout = num_instances * cores_per_instance
    disjoint = not colocated and rollout + trainer_world <= len(cores)
    pool = cores[:rollout] if disjoint else cores
    inst = tuple(tuple(pool[(i * cores_per_instance + j) % len(pool)] for j in range(cores_per_instance))
                 for i in range(num_instances))
    trainer = tuple(cores[rollout:]) if disjoint else tuple(cores)
    return CpuPlacement(inst, trainer, disjoint, colocated)


def node_placement(kind: DeviceKind, devices: int, num_instances: int, devices_per_instance: int,
                   trainer_world: int, colocated: bool) -> CpuPlacement | None:
    """The CPU placement over this node's first `devices` usable cores; None on accelerators, where
    Ray hands out the cards and a disaggregated mode's cards are disjoint by construction."""
    if kind != "cpu":
        return None
    cores = sorted(os.sched_getaffinity(0))[:devices]
    return cpu_placement(cores, num_instances, devices_per_instance, trainer_world, colocated)


def confine_to_devices(kind: DeviceKind, devices: list[int]) -> None:
    """Run this process (and what it starts) on `devices` only where a device is a core (CPU): how a
    measurement of one instance matches the instances of a run, each on its own cores."""
    if kind == "cpu":
        pin_process(devices)


def pin_process(cores: list[int] | tuple[int, ...]) -> None:
    """Restrict every thread of this process (and the processes it starts later) to `cores`."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:
            continue


def available_devices(kind: DeviceKind) -> int:
    """How many devices of this kind this node offers (CPU: usable cores)."""
    if kind == "cpu":
        return len(os.sched_getaffinity(0))
    if kind == "npu":
        import torch
        import torch_npu  # noqa: F401

        return int(torch.npu.device_count())
    import torch

    return int(torch.cuda.device_count())


def megatron_config_overrides(kind: DeviceKind) -> dict[str, object]:
    """TransformerConfig fields that depend on the device (CPU: build parameters on the host)."""
    return {"use_cpu_initialization": True} if kind == "cpu" else {}


def bind_local_device(kind: DeviceKind, local_rank: int) -> str:
    """Pin this trainer rank to its card (no-op on CPU); returns the torch device string to use."""
    if kind == "npu":
        import torch
        import torch_npu  # noqa: F401

        torch.npu.set_device(local_rank)
        return f"npu:{local_rank}"
    if kind == "cuda":
        import torch

        torch.cuda.set_device(local_rank)
        return f"cuda:{local_rank}"
    return "cpu"


# ---------------------------------------------------------------- Ascend stack (NPU path)

NPU_PACKAGES: dict[str, str] = {  # import name -> what installs it (docs/ascend.md gives the order)
    "torch_npu": "torch-npu (matching the torch version and the CANN release)",
    "mindspeed": "MindSpeed from https://gitee.com/ascend/MindSpeed (pip install -e .)",
    "vllm_ascend": "vllm-ascend from https://github.com/vllm-project/vllm-ascend (pip install -e .)",
}


def collective_backend(kind: DeviceKind) -> str:
    """torch.distributed backend for weight_refresh broadcasts: hccl on NPU, nccl on CUDA, gloo on CPU."""
    return spec(kind).dist_backend


def weight_transfer_backend(kind: DeviceKind, colocated: bool = False) -> str:
    """vLLM weight-transfer engine for a weight_refresh (registered in vLLM's factory under this name).

    CPU: `gloo` (ours, `asp_npu.weights.gloo_engine`). NPU/CUDA: vLLM's built-in `nccl` (HCCL under
    vllm-ascend) when trainer and rollout sit on different devices, `ipc` when they share them."""
    if kind == "cpu":
        return "gloo"
    return "ipc" if colocated else "nccl"


def cann_home() -> str | None:
    """The CANN toolkit this process sees (set by CANN's set_env.sh), or None when CANN is not sourced."""
    for var in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    return None


def vllm_platform_plugins() -> list[str]:
    """Names registered under vLLM's `vllm.platform_plugins` entry point (vllm-ascend registers 'ascend')."""
    from importlib.metadata import entry_points

    return sorted(ep.name for ep in entry_points(group="vllm.platform_plugins"))


def npu_stack_problems() -> list[str]:
    """Everything missing for the NPU path, each with what to install; empty when the stack is complete.

    Only looks (find_spec, environment, package metadata); imports nothing, so it is safe anywhere."""
    problems = []
    if cann_home() is None:
        problems.append("CANN is not sourced (no ASCEND_TOOLKIT_HOME): source "
                        "/usr/local/Ascend/ascend-toolkit/set_env.sh (launch/env_npu.sh does)")
    for module, how in NPU_PACKAGES.items():
        if not _has(module):
            problems.append(f"python package '{module}' is missing: install {how}")
    if _has("vllm_ascend") and "ascend" not in vllm_platform_plugins():
        problems.append("vllm-ascend is installed but not registered as a vLLM platform plugin "
                        "(entry point vllm.platform_plugins 'ascend'): reinstall it into this environment")
    return problems


def require_npu_stack() -> None:
    """Fail with one message naming every missing piece, before any actor or process group starts."""
    problems = npu_stack_problems()
    if problems:
        raise RuntimeError("the Ascend NPU stack is incomplete:\n  - " + "\n  - ".join(problems))


def vllm_platform(kind: DeviceKind) -> str | None:
    """Which vLLM platform serves rollout on this device: 'ascend' (vllm-ascend plugin) on NPU,
    None (vLLM's built-in detection: CPU or CUDA) elsewhere."""
    if kind != "npu":
        return None
    if not _has("vllm_ascend"):
        raise RuntimeError(f"rollout on NPU needs vllm-ascend: install {NPU_PACKAGES['vllm_ascend']}")
    return "ascend"


def visible_devices(kind: DeviceKind, devices: list[int]) -> dict[str, str]:
    """The variable that pins a process to `devices` (ASCEND_RT_VISIBLE_DEVICES on NPU); {} on CPU."""
    var = spec(kind).visible_devices_env
    return {var: ",".join(str(d) for d in devices)} if var else {}


def trainer_actor_options(kind: DeviceKind) -> dict[str, object]:
    """Ray options for one trainer-rank actor: a core on CPU, one card elsewhere (Ray then sets the
    visible-devices variable, so the actor's card is its local device 0)."""
    if kind == "cpu":
        env = {**loopback_env(), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
        return {"num_cpus": 1, "runtime_env": {"env_vars": env}}
    return {"num_cpus": 1, "resources": {spec(kind).ray_resource: 1}}
