"""weight_refresh through vLLM's weight-transfer engines: the driver's seam and the trainer's sender.

Three parties, vLLM's RL protocol between them:

- the driver (`TransferEngineLink`): `connect(instances, trainer)` once, `publish(version)` after each
  training step. It never touches a tensor: it asks trainer rank 0 to push, and turns any failure into one
  line naming the peer that is gone.
- trainer rank 0 (`push_from_trainer`, called from the trainer worker with its HF-weights gather):
  holds a `TrainerWeightTransferEngine` built by vLLM's `WeightTransferTrainerFactory` (`gloo` on
  CPU from `gloo_engine`, vLLM's `nccl` / `ipc` on NPU/CUDA), and drives the inference side
  through `InstancesClient`, vLLM's `VLLMWeightSyncClient` protocol over the RolloutInstance actors.
- every RolloutInstance (`init_weight_transfer`, `start_weight_update`, `update_weights`,
  `finish_weight_update`): drains or freezes its sequences (`pause_generation(mode="keep")`),
  lets the worker-side engine receive and load, then records the new version.

`backend="object-store"` keeps the path that needs no process group: the trainer's HF weights as one
safetensors blob through Ray's object store, loaded with `refresh_weights` on each instance.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from asp_npu.errors import UserError

OBJECT_STORE = "object-store"


class WeightSyncError(UserError):
    """A weight_refresh that could not complete; the message is one line naming the peer at fault."""


def _first_line(exc: BaseException) -> str:
    cause: Any = exc
    while getattr(cause, "cause", None) is not None:  # Ray wraps the remote error
        cause = cause.cause
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(cause)).strip()  # Ray colours its messages
    for line in text.splitlines():
        if line.strip() and not line.startswith(("Traceback", "  ")):
            return line.strip()
    return type(cause).__name__


@dataclass(frozen=True)
class WeightLink:
    """Everything trainer rank 0 needs to host the group and reach the instances (picklable)."""

    key: str
    backend: str
    host: str
    instances: tuple[Any, ...]  # RolloutInstance actor handles
    workers: tuple[int, ...]  # transfer_world_size of each instance
    drain: bool = True
    bucket_bytes: int = 256 << 20
    timeout_s: float = 300.0
    ids: tuple[int, ...] = ()  # the instances' numbers in the run (a re-formed group may skip some)

    @property
    def world_size(self) -> int:
        return 1 + sum(self.workers)

    def rank_offsets(self) -> list[int]:
        out, nxt = [], 1
        for w in self.workers:
            out.append(nxt)
            nxt += w
        return out


class InstancesClient:
    """vLLM's `VLLMWeightSyncClient` over RolloutInstance actors: each call fans out to all of them and
    waits at most `timeout_s`; a failure names the instance (and its ranks in the group)."""

    def __init__(self, link: WeightLink) -> None:
        self.link = link
        self.version: int | None = None  # set by `push_from_trainer` before each send
        self.reports: list[dict[str, Any]] = []

    def _gather(self, what: str, refs: Sequence[Any]) -> list[Any]:
        import ray

        deadline = time.monotonic() + self.link.timeout_s
        out = []
        for i, ref in enumerate(refs):
            try:
                out.append(ray.get(ref, timeout=max(1.0, deadline - time.monotonic())))
            except ray.exceptions.GetTimeoutError:
                raise WeightSyncError(
                    f"weight_refresh: {self._peer(i)} did not finish {what} "
                    f"within {self.link.timeout_s:.0f} s"
                ) from None
            except ray.exceptions.RayActorError:
                raise WeightSyncError(f"weight_refresh: {self._peer(i)} died during {what}") from None
            except Exception as exc:
                raise WeightSyncError(f"weight_refresh: {what} failed: {_first_line(exc)}") from None
        return out

    def _peer(self, i: int) -> str:
        lo = self.link.rank_offsets()[i]
        hi = lo + self.link.workers[i] - 1
        ranks = f"rank {lo}" if lo == hi else f"ranks {lo}-{hi}"
        return f"rollout instance {_instance_id(self.link, i)} (weight-group {ranks})"

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        base = int(init_info.get("rank_offset", 1))
        refs = []
        for inst, offset in zip(self.link.instances, self.link.rank_offsets(), strict=True):
            info = dict(init_info)
            if "rank_offset" in info:  # group backends: each instance's workers take their own ranks
                info["rank_offset"] = base - 1 + offset
            refs.append(inst.init_weight_transfer.remote(info))
        self._gather("init_weight_transfer_engine", refs)

    def start_weight_update(self) -> None:
        self._gather(
            "start_weight_update",
            [i.start_weight_update.remote(self.link.drain) for i in self.link.instances],
        )

    def update_weights(self, update_info: Any) -> None:
        self._gather("update_weights", [i.update_weights.remote(update_info) for i in self.link.instances])

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        version = int(weight_version) if weight_version is not None else self.version
        if version is None:
            raise WeightSyncError("weight_refresh: finish_weight_update without a version")
        self.reports = self._gather(
            "finish_weight_update", [i.finish_weight_update.remote(version) for i in self.link.instances]
        )


def _instance_id(link: WeightLink, i: int) -> int:
    return link.ids[i] if link.ids else i


def _snapshot_source() -> Any:
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class SnapshotSource(WeightSource):
        """One refresh's HF weights, replayed by the trainer engine (metadata and iteration agree)."""

        def __init__(self) -> None:
            self.version = 0
            self.items: list[tuple[str, Any]] = []

        def load(self, weights: Iterable[tuple[str, Any]], version: int) -> None:
            import numpy as np
            import torch

            items = []
            for name, value in weights:
                t = torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value
                items.append((name, t.detach().contiguous()))
            self.items, self.version = items, int(version)

        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.items]

        def __iter__(self) -> Any:
            return iter(self.items)

    return SnapshotSource()


def _trainer_init_info(link: WeightLink) -> Any:
    if link.backend == "gloo":
        from asp_npu.weights.gloo_engine import GlooTrainerInitInfo

        return GlooTrainerInitInfo(
            master_address=link.host,
            world_size=link.world_size,
            bucket_bytes=link.bucket_bytes,
            timeout_s=link.timeout_s,
            rank=0,
        )
    if link.backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        from asp_npu.net import free_port

        return NCCLTrainerInitInfo(
            master_address=link.host,
            master_port=free_port(link.host),
            world_size=link.world_size,
            rank=0,
            packed_buffer_size_bytes=link.bucket_bytes,
        )
    if link.backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(rank=0)
    raise UserError(f"weight_refresh: unknown weight-transfer backend '{link.backend}' (gloo, nccl, ipc)")


_SENDERS: dict[str, tuple[Any, InstancesClient, Any]] = {}  # link.key -> (engine, client, source)


def push_from_trainer(
    link: WeightLink, weights: Iterable[tuple[str, Any]] | None, version: int
) -> dict[str, Any]:
    """Trainer rank 0: connect on first use, then (with `weights`, HF-named (name, tensor) pairs) send
    them as `version` through vLLM's trainer-side engine. Returns the instances' RefreshReports."""
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    from asp_npu.weights import gloo_engine

    gloo_engine.register()
    t0 = time.perf_counter()
    formed = link.key not in _SENDERS
    if formed:
        for key in list(_SENDERS):  # a new key re-forms the group: the old one is torn down first
            close_sender(key)
        client, source = InstancesClient(link), _snapshot_source()
        engine = WeightTransferTrainerFactory.trainer_init(
            _trainer_init_info(link), client=client, source=source
        )
        _SENDERS[link.key] = (engine, client, source)
    connect_s = time.perf_counter() - t0
    if weights is None:
        return {"connect_s": connect_s, "instances": []}
    engine, client, source = _SENDERS[link.key]
    client.link = link  # the same group; the driver may have switched drain / keep since
    source.load(weights, version)
    client.version = int(version)
    t1 = time.perf_counter()
    try:
        engine.send_weights()
    except BaseException:
        close_sender(link.key)  # a broken group is not reused: the driver re-forms it
        raise
    return {"connect_s": connect_s if formed else 0.0, "formed": formed, "send_s": time.perf_counter() - t1,
            "instances": client.reports}


def close_sender(key: str) -> None:
    entry = _SENDERS.pop(key, None)
    if entry is not None:
        try:
            entry[0].shutdown()
        except Exception:  # a peer already gone must not turn shutdown into a crash
            pass


class TransferEngineLink:
    """The driver's weight_refresh seam: `connect(instances, trainer)` once, `publish(version)` per step.

    `trainer` is anything with `push_weights_to_rollout(link, send)` running the push in trainer rank 0
    (`TrainerGroup` does; `RayTrainer` adapts a Ray actor) and, for the object-store fallback,
    `get_hf_weights()`. `backend=None` takes `device.weight_transfer_backend(kind, colocated)`.
    """

    def __init__(
        self,
        backend: str | None = None,
        kind: str = "cpu",
        colocated: bool = False,
        drain: bool = True,
        bucket_bytes: int = 256 << 20,
        timeout_s: float = 300.0,
        host: str = "127.0.0.1",
    ) -> None:
        from asp_npu.device import weight_transfer_backend

        self.backend = backend or weight_transfer_backend(kind, colocated)  # type: ignore[arg-type]
        self.drain, self.bucket_bytes, self.timeout_s, self.host = drain, bucket_bytes, timeout_s, host
        self.link: WeightLink | None = None
        self.instances: list[Any] = []
        self.trainer: Any = None
        self.history: list[dict[str, Any]] = []

    def connect(self, instances: Sequence[Any], trainer: Any) -> float:
        """Form the transfer group (trainer rank 0 + every instance worker); returns seconds taken.
        Call again after an instance is replaced: a process group cannot take in a new member."""
        self.instances, self.trainer = list(instances), trainer
        if self.backend == OBJECT_STORE:
            return 0.0
        workers = tuple(
            self._get("transfer_world_size", [i.transfer_world_size.remote() for i in self.instances])
        )
        self.link = WeightLink(
            uuid.uuid4().hex,
            self.backend,
            self.host,
            tuple(self.instances),
            workers,
            self.drain,
            self.bucket_bytes,
            self.timeout_s,
        )
        t0 = time.perf_counter()
        self._push(send=False)
        return time.perf_counter() - t0

    def regroup(self, instances: Sequence[Any], ids: Sequence[int], workers: Sequence[int]) -> WeightLink:
        """A new group over `instances` (numbered `ids` in the run, `workers` ranks each): a new key, so
        trainer rank 0 tears the old group down and hosts the new one (a fresh port) on its next push,
        and every member's worker leaves the old group for it. Used when an instance is lost (the
        survivors go on without it) and when its replacement is up (it joins). Nothing blocks here."""
        if self.backend == OBJECT_STORE:
            raise WeightSyncError("weight_refresh: the object-store path has no group to re-form")
        self.instances = list(instances)
        self.link = WeightLink(uuid.uuid4().hex, self.backend, self.host, tuple(instances), tuple(workers),
                               self.drain, self.bucket_bytes, self.timeout_s, tuple(ids))
        return self.link

    def publish(self, version: int | None = None) -> dict[str, Any]:
        """Ship the trainer's current weights to every instance; returns per-instance RefreshReports."""
        t0 = time.perf_counter()
        if self.backend == OBJECT_STORE:
            out = self._publish_object_store()
        else:
            if self.link is None:
                raise WeightSyncError("weight_refresh: publish before connect")
            out = self._push(send=True)
        out = {**out, "backend": self.backend, "total_s": time.perf_counter() - t0}
        if version is not None and out["instances"] and out["instances"][0]["version"] != version:
            raise WeightSyncError(
                f"weight_refresh: trainer sent version {out['instances'][0]['version']}, expected {version}"
            )
        self.history.append(out)
        return out

    def set_drain(self, drain: bool) -> None:
        """Drain (sequences finish on the old weights) or keep (they continue on the new ones)."""
        self.drain = drain
        if self.link is not None:
            self.link = replace(self.link, drain=drain)

    def _push(self, send: bool) -> dict[str, Any]:
        assert self.link is not None
        exe = ThreadPoolExecutor(max_workers=1)
        future = exe.submit(self.trainer.push_weights_to_rollout, self.link, send)
        try:
            return future.result(timeout=self.link.timeout_s * 2 + 30)
        except Exception as exc:
            raise WeightSyncError(self._diagnose("send" if send else "connect", exc)) from None
        finally:
            exe.shutdown(wait=False)  # never wait on a push stuck behind a dead peer

    def _diagnose(self, what: str, exc: BaseException) -> str:
        """One line: which peer of the transfer group is gone (pinged), else the error's first line.
        A failure the trainer side already attributed (`WeightSyncError`) keeps its words."""
        import ray

        cause: Any = exc
        while getattr(cause, "cause", None) is not None:
            cause = cause.cause
        if isinstance(cause, WeightSyncError):
            return _first_line(cause)
        gone = []
        if not _answers(getattr(self.trainer, "ping", None)):
            gone.append("the trainer (weight-group rank 0)")
        offsets = self.link.rank_offsets() if self.link else [0] * len(self.instances)
        ids = list(self.link.ids) if self.link and self.link.ids else list(range(len(self.instances)))
        for i, inst in enumerate(self.instances):
            try:
                ray.get(inst.ping.remote(), timeout=10)
            except Exception:
                gone.append(f"rollout instance {ids[i]} (weight-group rank {offsets[i]})")
        msg = _first_line(exc)
        if gone:
            return f"weight_refresh {what} failed: {', '.join(gone)} is gone ({msg})"
        return f"weight_refresh {what} failed: {msg}"

    def _get(self, what: str, refs: list[Any]) -> list[Any]:
        return InstancesClient(
            WeightLink(
                "",
                self.backend,
                self.host,
                tuple(self.instances),
                (1,) * len(self.instances),
                timeout_s=self.timeout_s,
            )
        )._gather(what, refs)

    def _publish_object_store(self) -> dict[str, Any]:
        """The fallback without a process group: one safetensors blob through Ray's object store."""
        import ray

        hf = self.trainer.get_hf_weights()
        blob = ray.put(hf.to_safetensors_bytes() if hasattr(hf, "to_safetensors_bytes") else hf)
        version = int(getattr(hf, "version", 0))
        reports = self._get(
            "refresh_weights", [i.refresh_weights.remote(blob, version, self.drain) for i in self.instances]
        )
        return {"instances": reports}

    def close(self) -> None:
        if self.link is not None and self.trainer is not None and hasattr(self.trainer, "close_weight_link"):
            try:
                self.trainer.close_weight_link(self.link.key)
            except Exception:
                pass
        self.link = None


def _answers(ping: Any) -> bool:
    if ping is None:
        return True
    try:
        ping()
        return True
    except Exception:
        return False


class RayTrainer:
    """Adapts a Ray actor whose rank-0 method `push_weights_to_rollout(link, send)` does the push."""

    def __init__(self, actor: Any, timeout_s: float = 600.0) -> None:
        self.actor, self.timeout_s = actor, timeout_s

    def push_weights_to_rollout(self, link: WeightLink, send: bool = True) -> dict[str, Any]:
        import ray

        return ray.get(self.actor.push_weights_to_rollout.remote(link, send), timeout=self.timeout_s)

    def get_hf_weights(self) -> Any:
        import ray

        return ray.get(self.actor.get_hf_weights.remote(), timeout=self.timeout_s)

    def ping(self) -> None:
        import ray

        ray.get(self.actor.ping.remote(), timeout=10)


class StateDictTrainer:
    """Ray actor body standing in for trainer rank 0 where no megatron trainer runs (tests,
    benchmarks): holds an HF state dict and pushes it like `TrainerWorker.push_weights_to_rollout`."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}
        self.version = 0

    def set_weights(self, state: dict[str, Any], version: int) -> int:
        self.state, self.version = dict(state), int(version)
        return len(self.state)

    def push_weights_to_rollout(self, link: WeightLink, send: bool = True) -> dict[str, Any]:
        return push_from_trainer(link, self.state.items() if send else None, self.version)

    def get_hf_weights(self) -> Any:
        from asp_npu.weights.hf import HFWeights

        return HFWeights(self.version, {k: _numpy(v) for k, v in self.state.items()})

    def close_weight_link(self, key: str) -> None:
        close_sender(key)

    def ping(self) -> int:
        return self.version


def _numpy(value: Any) -> Any:
    import numpy as np

    return value if isinstance(value, np.ndarray) else value.detach().cpu().numpy()
