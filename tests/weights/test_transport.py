"""Weight transport: bucketing logic, the object-store path, and the collective path over gloo with
real processes (trainer rank 0 broadcasting to two instance processes). Refresh into real vLLM
engines through vLLM's weight-transfer engine: tests/weights/test_engine_link.py."""

from __future__ import annotations

import hashlib
import multiprocessing as mp

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.device import collective_backend
from asp_npu.net import reserve_port
from asp_npu.weights.transport import (
    CollectiveTransport,
    GroupSpec,
    ObjectStoreTransport,
    RefreshStats,
    StaleVersionError,
    plan_buckets,
)


def _digest(t: torch.Tensor) -> tuple[str, str, tuple[int, ...]]:
    raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(raw).hexdigest(), str(t.dtype), tuple(t.shape)


def _weights(version: int) -> dict[str, torch.Tensor]:
    """Mixed dtypes and odd sizes (alignment inside buckets), one tensor bigger than a bucket."""
    g = torch.Generator().manual_seed(version)
    return {
        "model.embed_tokens.weight": torch.randn(37, 16, generator=g),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(3, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.gate_proj.weight": torch.randn(64, 40, generator=g).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.randn(5, generator=g).half(),
        "step": torch.tensor([version], dtype=torch.int64),
        "mask": torch.rand(7, generator=g) > 0.5,
        "lm_head.weight": torch.randn(16, 37, generator=g),
    }


@given(st.lists(st.integers(0, 5000), max_size=40), st.integers(1, 4096))
@settings(max_examples=200, deadline=None)
def test_buckets_keep_order_and_bound_size(sizes: list[int], cap: int) -> None:
    buckets = plan_buckets(sizes, cap)
    assert [i for b in buckets for i in b] == list(range(len(sizes)))
    for b in buckets:
        assert b, "no empty bucket"
        assert len(b) == 1 or sum(sizes[i] for i in b) <= cap


def test_refresh_metrics_report_time_and_bytes() -> None:
    m = RefreshStats(3, 2_000_000_000, 2.0, 10, 8, "collective").metrics()
    assert m["weight_refresh/bytes"] == 2e9 and m["weight_refresh/seconds"] == 2.0
    assert m["weight_refresh/gbps"] == pytest.approx(8.0)


def test_object_store_path_is_bit_identical_and_versioned() -> None:
    sender, receiver = ObjectStoreTransport(), ObjectStoreTransport()
    w = _weights(1)
    w["numpy_param"] = np.arange(6, dtype=np.float32).reshape(2, 3)
    packet = sender.publish(w, version=1)
    version, got = receiver.receive(packet)
    assert version == 1 and set(got) == set(w)
    for k, v in w.items():
        assert _digest(torch.as_tensor(v)) == _digest(got[k]), k
    assert sender.history[0].nbytes == packet.nbytes > 0
    with pytest.raises(StaleVersionError):
        receiver.receive(packet)


def _receiver(port: int, rank: int, world: int, out: mp.Queue) -> None:
    """Rank 1 takes whole refreshes, rank 2 streams them bucket by bucket; both see versions 1, 2,
    a replayed 2 (refused, yet drained so the group stays in step) and 3."""
    group = GroupSpec("127.0.0.1", port, world, collective_backend("cpu"), timeout_s=300)
    tr = CollectiveTransport(group, rank, device="cpu", bucket_bytes=1024)
    try:
        for expect_stale in (False, False, True, False):
            streamed: dict[str, torch.Tensor] = {}
            try:
                if rank == 1:
                    version, weights = tr.receive()
                else:
                    version, weights = tr.receive(on_bucket=lambda b, into=streamed: into.update(b))
                    assert weights == {}
                    weights = streamed
            except StaleVersionError:
                out.put((rank, "stale", {}, None))
                continue
            assert not expect_stale
            out.put((rank, version, {k: _digest(v) for k, v in weights.items()}, tr.history[-1]))
    finally:
        tr.close()


@pytest.mark.slow
def test_collective_gloo_delivers_bit_identical_weights_to_two_instances() -> None:
    ctx = mp.get_context("spawn")
    sock = reserve_port()
    port, world = sock.getsockname()[1], 3
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_receiver, args=(port, r, world, out)) for r in (1, 2)]
    for p in procs:
        p.start()
    spec = GroupSpec("127.0.0.1", port, world, collective_backend("cpu"), timeout_s=300)
    sender = None
    try:
        sender = CollectiveTransport(spec, 0, device="cpu", bucket_bytes=1024, listen_socket=sock)
        sent = {}
        for version in (1, 2):
            w = _weights(version)
            stats = sender.send(w, version)
            assert stats.buckets > 1 and stats.tensors == len(w)
            assert stats.nbytes == sum(t.numel() * t.element_size() for t in w.values())
            sent[version] = {k: _digest(v) for k, v in w.items()}
        with pytest.raises(StaleVersionError):
            sender.send(_weights(2), 2)  # the sender refuses to go back ...
        sender.last_version = None
        sender.send(_weights(2), 2)  # ... and so does every receiver, when a replay gets through
        w = _weights(3)
        sender.send(w, 3)
        sent[3] = {k: _digest(v) for k, v in w.items()}
        got = [out.get(timeout=300) for _ in range(2 * 4)]
    finally:
        if sender is not None:
            sender.close()
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    for rank in (1, 2):
        mine = [(v, d, s) for r, v, d, s in got if r == rank]
        assert [v for v, _, _ in mine] == [1, 2, "stale", 3]
        for version, digests, stats in mine:
            if version == "stale":
                continue
            assert digests == sent[version]
            assert stats.version == version and stats.nbytes == sender.history[0].nbytes
    assert sent[1] != sent[2] != sent[3]
