"""Weight refresh cost on one machine: object-store path vs collective (gloo) path, side by side.

A synthetic HF-named fp32 state dict of `--mib` MiB goes from the driver (trainer rank 0) to two
receivers, `--repeats` refreshes per path; prints the median seconds per refresh and GB/s, for the
sender and until the last receiver holds the tensors.

- object store: safetensors blob `ray.put` once, each of two Ray actors `ray.get`s and parses it;
- collective: two spawned processes in a gloo broadcast group on 127.0.0.1 (`CollectiveTransport`).

    .venv/bin/python benchmarks/weight_transport.py [--mib 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import torch

from asp_npu.device import collective_backend, loopback_env
from asp_npu.net import reserve_port
from asp_npu.weights.transport import (
    CollectiveTransport,
    GroupSpec,
    ObjectStoreTransport,
)


def make_state(mib: int) -> dict[str, torch.Tensor]:
    per = mib * (1 << 20) // 16 // 4
    g = torch.Generator().manual_seed(0)
    return {f"model.layers.{i}.mlp.up_proj.weight": torch.randn(per, generator=g) for i in range(16)}


def _receiver(port: int, rank: int, repeats: int, bucket: int, out: mp.Queue) -> None:
    tr = CollectiveTransport(
        GroupSpec("127.0.0.1", port, 3, collective_backend("cpu"), timeout_s=300), rank, bucket_bytes=bucket
    )
    for _ in range(repeats):
        tr.receive()
        out.put((rank, time.time()))
    tr.close()


def bench_collective(
    state: dict[str, torch.Tensor], repeats: int, bucket: int
) -> tuple[list[float], list[float]]:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    sock = reserve_port()
    port = sock.getsockname()[1]
    procs = [ctx.Process(target=_receiver, args=(port, r, repeats, bucket, out)) for r in (1, 2)]
    for p in procs:
        p.start()
    spec = GroupSpec("127.0.0.1", port, 3, collective_backend("cpu"), timeout_s=300)
    tr = CollectiveTransport(spec, 0, bucket_bytes=bucket, listen_socket=sock)
    send_s, done_s = [], []
    for v in range(1, repeats + 1):
        t0 = time.time()
        send_s.append(tr.send(state, v).seconds)
        done_s.append(max(out.get(timeout=300)[1] for _ in range(2)) - t0)
    tr.close()
    for p in procs:
        p.join(timeout=60)
    return send_s, done_s


def bench_object_store(state: dict[str, torch.Tensor], repeats: int) -> tuple[list[float], list[float]]:
    import ray

    @ray.remote(num_cpus=0)
    class Receiver:
        def __init__(self) -> None:
            self.tr = ObjectStoreTransport()

        def receive(self, packets: list) -> float:
            self.tr.receive(packets[0])
            return time.time()

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actors = [Receiver.remote() for _ in range(2)]
        ray.get([a.__ray_ready__.remote() for a in actors])
        sender = ObjectStoreTransport()
        send_s, done_s = [], []
        for v in range(1, repeats + 1):
            t0 = time.time()
            packet = sender.publish(state, v)
            send_s.append(time.time() - t0)
            done_s.append(max(ray.get([a.receive.remote([packet]) for a in actors])) - t0)
        return send_s, done_s
    finally:
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bucket-mib", type=int, default=64)
    args = ap.parse_args()
    os.environ.update(loopback_env())
    state = make_state(args.mib)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    results = {
        "object-store": bench_object_store(state, args.repeats),
        "collective (gloo)": bench_collective(state, args.repeats, args.bucket_mib << 20),
    }
    print(
        f"{nbytes / 2**20:.0f} MiB fp32, 2 receivers, {args.repeats} refreshes each (median; first included)"
    )
    print(f"{'path':<18} {'sender s':>9} {'all received s':>15} {'GB/s to all':>12}")
    for name, (send_s, done_s) in results.items():
        med = statistics.median(done_s)
        print(f"{name:<18} {statistics.median(send_s):>9.3f} {med:>15.3f} {2 * nbytes / med / 1e9:>12.2f}")


if __name__ == "__main__":
    main()
