"""How a weight_refresh moves the trainer's new weights (HF names) to every rollout instance.

Two transports behind one small interface, both carrying a monotonically increasing `version`
and both reporting `RefreshStats` (seconds and bytes per refresh, the metrics users ask for when
parameter sync grows to minutes: verl #4896):

- `ObjectStoreTransport` — one safetensors blob through Ray's object store. What CPU runs use today:
  simple, no extra process group, cost grows with model size x instances (each instance pulls a copy).
- `CollectiveTransport` — torch.distributed broadcast from trainer rank 0 to every instance worker
  over a dedicated process group (HCCL on NPU, NCCL on CUDA, gloo on CPU: the backend comes from
  `asp_npu.device.collective_backend`). Tensors travel in flat byte buckets (bounded memory, few
  large messages; size them like HCCL_BUFFSIZE), preceded by a header (version + manifest), so the
  receivers need no side channel and get bit-identical tensors.

The group is created with vLLM's stateless process-group helper, which does not touch the
default process group of either side (megatron's world on the trainer, vLLM's own world in the
worker) and which vllm-ascend implements for HCCL.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from asp_npu.errors import UserError

DEFAULT_BUCKET_BYTES = 256 << 20  # matches HCCL_BUFFSIZE=256 (MB) in launch/env_npu.sh


@dataclass(frozen=True)
class RefreshStats:
    """One weight_refresh as seen by the side that recorded it."""

    version: int
    nbytes: int
    seconds: float
    tensors: int
    buckets: int
    transport: str

    def metrics(self) -> dict[str, float]:
        return {
            "weight_refresh/version": float(self.version),
            "weight_refresh/bytes": float(self.nbytes),
            "weight_refresh/seconds": self.seconds,
            "weight_refresh/gbps": (self.nbytes * 8 / 1e9 / self.seconds) if self.seconds > 0 else 0.0,
        }


class StaleVersionError(UserError):
    """A refresh carried a version not newer than the one already loaded."""


def _check_version(last: int | None, version: int) -> None:
    if last is not None and version <= last:
        raise StaleVersionError(
            f"weight_refresh: received version {version} after version {last}; versions must increase"
        )


def _as_torch(name: str, value: Any) -> Any:
    import torch

    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, torch.Tensor):
        return value.detach().contiguous()
    raise UserError(f"weight_refresh: '{name}' is a {type(value).__name__}, expected a tensor or array")


# ---------------------------------------------------------------- object store path


@dataclass(frozen=True)
class WeightPacket:
    """A refresh in the object store: `payload` is an ObjectRef when Ray is up, else the bytes."""

    version: int
    nbytes: int
    tensors: int
    payload: Any

    def blob(self) -> bytes:
        if isinstance(self.payload, bytes | bytearray | memoryview):
            return bytes(self.payload)
        import ray

        return ray.get(self.payload)


class ObjectStoreTransport:
    """HF-named tensors as one safetensors blob through Ray's object store (the CPU path)."""

    name = "object-store"

    def __init__(self) -> None:
        self.last_version: int | None = None
        self.history: list[RefreshStats] = []

    def publish(self, weights: Mapping[str, Any], version: int) -> WeightPacket:
        from safetensors.torch import save

        t0 = time.perf_counter()
        tensors = {k: _as_torch(k, v).cpu() for k, v in weights.items()}
        blob = save(tensors)
        payload: Any = blob
        try:
            import ray

            if ray.is_initialized():
                payload = ray.put(blob)
        except ImportError:
            pass
        self.history.append(
            RefreshStats(version, len(blob), time.perf_counter() - t0, len(tensors), 1, self.name)
        )
        return WeightPacket(version, len(blob), len(tensors), payload)

    def receive(self, packet: WeightPacket) -> tuple[int, dict[str, Any]]:
        """Receiver side: (version, HF-named torch tensors)."""
        from safetensors.torch import load

        _check_version(self.last_version, packet.version)
        t0 = time.perf_counter()
        weights = load(packet.blob())
        self.last_version = packet.version
        self.history.append(
            RefreshStats(packet.version, packet.nbytes, time.perf_counter() - t0, len(weights), 1, self.name)
        )
        return packet.version, weights


# ---------------------------------------------------------------- collective path


_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")


def _padded(n: int) -> int:
    """Byte size rounded up to 8, so every tensor starts aligned inside its bucket."""
    return (n + 7) // 8 * 8





def plan_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Indices of tensors grouped in order into buckets of at most `bucket_bytes` (a larger tensor
    gets a bucket of its own). Order is kept so sender and receivers agree without sorting."""
    buckets: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for i, n in enumerate(sizes):
        if cur and used + n > bucket_bytes:
            buckets.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n
    if cur:
        buckets.append(cur)
    return buckets


@dataclass(frozen=True)
class GroupSpec:
    """Where and how big the weight group is: rank 0 is trainer rank 0, ranks 1.. are instance workers."""

    host: str
    port: int
    world_size: int
    backend: str  # from asp_npu.device.collective_backend(kind)
    timeout_s: float = 1800.0


class CollectiveTransport:
    """One end of the broadcast group. Rank 0 calls `send`, every other rank calls `receive`."""

    name = "collective"

    def __init__(
        self,
        group: GroupSpec,
        rank: int,
        device: str = "cpu",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        listen_socket: socket.socket | None = None,
    ) -> None:
        from datetime import timedelta

        from vllm.distributed.utils import stateless_init_torch_distributed_process_group

        if not 0 <= rank < group.world_size:
            raise UserError(f"weight group: rank {rank} outside world_size {group.world_size}")
        self.group, self.rank, self.device, self.bucket_bytes = group, rank, device, bucket_bytes
        if listen_socket is not None and rank != 0:
            raise UserError("weight group: only rank 0 hosts the rendezvous store (listen_socket)")
        extra = {"listen_socket": listen_socket} if listen_socket is not None else {}
        self.pg = stateless_init_torch_distributed_process_group(
            group.host,
            group.port,
            rank,
            group.world_size,
            group.backend,
            timeout=timedelta(seconds=group.timeout_s),
            **extra,
        )
        self.last_version: int | None = None
        self.history: list[RefreshStats] = []

    def _broadcast(self, tensor: Any) -> None:
        self.pg.broadcast(tensor, 0).wait()

    def _broadcast_bytes(self, data: bytes | None) -> bytes:
        import torch

        n = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64, device=self.device)
        self._broadcast(n)
        buf = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
            if data is not None
            else torch.empty(int(n.item()), dtype=torch.uint8, device=self.device)
        )
        self._broadcast(buf)
        return buf.cpu().numpy().tobytes()

    def send(self, weights: Mapping[str, Any], version: int) -> RefreshStats:
        """Trainer rank 0: broadcast `weights` (HF names -> tensors/arrays) as `version`."""
        import torch

        if self.rank != 0:
            raise UserError("weight group: only rank 0 (trainer rank 0) sends")
        _check_version(self.last_version, version)
        t0 = time.perf_counter()
        names = list(weights)
        tensors = [_as_torch(k, weights[k]) for k in names]
        for k, t in zip(names, tensors, strict=True):
            if str(t.dtype).removeprefix("torch.") not in _DTYPES:
                raise UserError(f"weight_refresh: '{k}' has unsupported dtype {t.dtype}")
        sizes = [t.numel() * t.element_size() for t in tensors]
        buckets = plan_buckets([_padded(n) for n in sizes], self.bucket_bytes)
        header = {
            "version": version,
            "tensors": [
                {"name": k, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
                for k, t in zip(names, tensors, strict=True)
            ],
            "buckets": buckets,
        }
        self._broadcast_bytes(json.dumps(header).encode())
        for idx in buckets:
            parts = []
            for i in idx:
                parts.append(tensors[i].reshape(-1).view(torch.uint8).to(self.device))
                if _padded(sizes[i]) != sizes[i]:
                    parts.append(
                        torch.zeros(_padded(sizes[i]) - sizes[i], dtype=torch.uint8, device=self.device)
                    )
            self._broadcast(torch.cat(parts))
        stats = RefreshStats(
            version, sum(sizes), time.perf_counter() - t0, len(names), len(buckets), self.name
        )
        self.last_version = version
        self.history.append(stats)
        return stats

    def receive(
        self, on_bucket: Callable[[dict[str, Any]], None] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """Instance worker: block for the next refresh; returns (version, HF-named tensors on `device`).

        With `on_bucket`, each bucket's tensors are handed over as soon as they arrive and not kept
        (an instance whose memory is mostly KV cache then needs room for one bucket, not a second
        copy of the model); the returned dict is then empty. A stale version is still drained from
        the group, so sender and receivers stay in step, but nothing of it is handed over."""
        import torch

        if self.rank == 0:
            raise UserError("weight group: rank 0 sends, it does not receive")
        t0 = time.perf_counter()
        header = json.loads(self._broadcast_bytes(None))
        version = int(header["version"])
        stale = self.last_version is not None and version <= self.last_version
        specs = header["tensors"]
        out: dict[str, Any] = {}
        nbytes = 0
        for idx in header["buckets"]:
            shapes = [torch.Size(specs[i]["shape"]) for i in idx]
            dtypes = [getattr(torch, specs[i]["dtype"]) for i in idx]
            sizes = [
                s.numel() * torch.empty((), dtype=d).element_size()
                for s, d in zip(shapes, dtypes, strict=True)
            ]
            flat = torch.empty(sum(_padded(n) for n in sizes), dtype=torch.uint8, device=self.device)
            self._broadcast(flat)
            bucket: dict[str, Any] = {}
            off = 0
            for i, shape, dtype, n in zip(idx, shapes, dtypes, sizes, strict=True):
                bucket[specs[i]["name"]] = flat[off : off + n].view(dtype).reshape(shape)
                off += _padded(n)
            nbytes += sum(sizes)
            if stale:
                continue
            if on_bucket is not None:
                on_bucket(bucket)
            else:
                out.update(bucket)
        _check_version(self.last_version, version)
        self.last_version = version
        self.history.append(
            RefreshStats(
                version, nbytes, time.perf_counter() - t0, len(specs), len(header["buckets"]), self.name
            )
        )
        return version, out

    def close(self) -> None:
        from vllm.distributed.utils import stateless_destroy_torch_distributed_process_group

        if self.pg is not None:
            try:
                stateless_destroy_torch_distributed_process_group(self.pg)
            except Exception:  # a peer already gone must not turn shutdown into a crash
                self.pg.shutdown()
            self.pg = None
