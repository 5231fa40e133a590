"""The trainer's process groups for a validated `core.layout.ParallelLayout`: what each rank runs.

The layout itself and its rules (`check_layout`, run on the driver before any process group exists,
listing every problem) live in `asp_npu/core/layout.py`, so a bad config costs a second, not a hung
gloo/HCCL rendezvous.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from asp_npu.core.layout import ParallelLayout


def rendezvous_file(master_addr: str, master_port: int, fresh: bool = False) -> Path | None:
    """Where ranks on one machine meet: a file in the temp folder (None for a network address).

    torch's TCPStore server listens on every interface whatever address it is given, so a loopback
    group rendezvouses through a FileStore instead (gloo then binds to GLOO_SOCKET_IFNAME=lo).
    `fresh`: remove a stale file a crashed run left under the same port (rank 0, before any rank starts).
    """
    import ipaddress
    import os
    import tempfile

    try:
        if not ipaddress.ip_address(master_addr).is_loopback:
            return None
    except ValueError:
        if master_addr != "localhost":
            return None
    path = Path(tempfile.gettempdir()) / f"asp_npu_rdzv_{os.getuid()}_{master_port}"
    if fresh:
        path.unlink(missing_ok=True)
    return path


def init_parallel(backend: str, rank: int, layout: ParallelLayout, master_addr: str, master_port: int,
                  seed: int, timeout_s: float = 600.0) -> None:
    """torch.distributed + megatron parallel_state + megatron's model-parallel RNG, on one rank.

    The caller has already run `asp_npu.device.prepare_megatron(kind)` (MindSpeed adaptor) and
    `asp_npu.trainer.cpu_compat.prepare(kind)` (CPU shim).
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        rdzv = rendezvous_file(master_addr, master_port)
        init_method = f"file://{rdzv}" if rdzv else f"tcp://{master_addr}:{master_port}"
        dist.init_process_group(backend=backend, init_method=init_method,
                                rank=rank, world_size=layout.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    set_layout(layout, seed)


def set_layout(layout: ParallelLayout, seed: int) -> None:
    """(Re)build megatron's parallel groups for `layout` on an initialised world; seeds its RNG."""
    from megatron.core import parallel_state, tensor_parallel

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=layout.tp,
                                             pipeline_model_parallel_size=layout.pp,
                                             context_parallel_size=layout.cp,
                                             expert_model_parallel_size=layout.ep,
                                             expert_tensor_parallel_size=layout.expert_tp)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def destroy_parallel() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
