"""Measure the trainer for the simulator (`asp-npu calibrate`): wall seconds per token of `train_step`.

Why: the simulator's trainer cost (`train_s_per_token`, device-seconds per sequence token) must come
from this machine's megatron trainer at the run's shape, not from a guess or from the run it is
asked to predict. The batch is one minibatch of the config: `rl_config.mini_batch_size` samples in
groups of `n_samples_per_prompt`, the config's own prompts (tokenized as the controller does),
responses of random token ids with lengths spread evenly over 1..`max_tokens` (a fixed seed: the
same batch every time), so `use_dynamic_bsz` / `micro_batch_size` split it as in a run. The group
is the real `TrainerGroup` (Ray actors, gloo), placed where the run places it; a step is timed on
the driver around `train_step`, as the pipeline's `timing/update` is.

A step is not proportional to its tokens: the optimizer update, the per-micro-batch launches and the
call itself cost the same for a minibatch of short answers as for one of long answers (measured on
the bench model: 0.2-0.35 s of a 0.7 s step). So two minibatches of the same sample count are timed,
answers over the whole 1..`max_tokens` and over its first quarter, and `sim.calibrate.fit_step` splits
a step into a fixed part and seconds per token (what the simulator's `train_step_s` and
`train_s_per_token` take).
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from typing import Any

from asp_npu.config import Config
from asp_npu.types import TrainBatch, Trajectory


def calibration_batch(cfg: Config, seed: int = 0, length_scale: float = 1.0) -> TrainBatch:
    """One minibatch of the config's shape (module docstring); `length_scale` shrinks the longest
    answer to that fraction of `max_tokens`."""
    from transformers import AutoTokenizer

    from asp_npu.data.datasets import config_prompts, encode_prompt

    rl, gen = cfg.rl_config, cfg.generate_config
    n = rl.n_samples_per_prompt
    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    prompts = config_prompts(cfg.data)
    rng = random.Random(seed)
    vocab = len(tok)
    lo = min(16, vocab - 1)
    max_tokens = max(2, int(gen.sampling_config.max_tokens * length_scale))
    groups = rl.mini_batch_size // n
    total = groups * n
    lengths = [1 + i * (max_tokens - 1) // max(1, total - 1) for i in range(total)]
    rng.shuffle(lengths)  # a run's minibatch mixes long and short answers
    trajs = []
    for g in range(groups):
        ids = encode_prompt(prompts[g % len(prompts)], tok)[: rl.max_prompt_length]
        for k in range(n):
            length = lengths[g * n + k]
            trajs.append(
                Trajectory(
                    prompt_id=f"calib-{g}",
                    sample_idx=k,
                    prompt_token_ids=list(ids),
                    response_token_ids=[rng.randrange(lo, vocab) for _ in range(length)],
                    logprobs=[-rng.uniform(0.5, 3.0) for _ in range(length)],
                    finish_reason="length",
                    reward=float(rng.random() < 0.5),
                    policy_version=0,
                )
            )
    return TrainBatch(trajs, n)


def batch_tokens(batch: TrainBatch) -> int:
    return sum(len(t.prompt_token_ids) + t.response_len for t in batch.trajectories)


def timed_steps(group: Any, batch: TrainBatch, steps: int) -> list[float]:
    """Wall seconds of `steps` consecutive `train_step` calls (each stamped with the group's version)."""
    out = []
    for _ in range(steps):
        for t in batch.trajectories:
            t.policy_version = group.version
        t0 = time.perf_counter()
        group.train_step(batch)
        out.append(time.perf_counter() - t0)
    return out


class BackgroundTrainer:
    """Trainer steps back to back in a thread (the load a rollout engine shares its cores with)."""

    def __init__(self, group: Any, batch: TrainBatch) -> None:
        self.group, self.batch = group, batch
        self.stop = threading.Event()
        self.steps = 0
        self.thread = threading.Thread(target=self._loop, name="calib-trainer", daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            timed_steps(self.group, self.batch, 1)
            self.steps += 1

    def __enter__(self) -> BackgroundTrainer:
        self.thread.start()
        time.sleep(0.5)  # the first step has started
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def s_per_token(step_s: list[float], tokens: int) -> float:
    return statistics.median(step_s) / tokens


def matmul_flops_per_s(size: int = 512, min_s: float = 0.3, dtype: str = "float32") -> float:
    """FLOP/s of one device on a timed square torch matmul (`2 size^3` FLOPs each, repeated for at least
    `min_s` seconds after one warm-up); on CPU one thread, i.e. one core: the peak a core's share of
    the trainer is measured against (MFU)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(size, size, dtype=getattr(torch, dtype))
        b = torch.randn(size, size, dtype=getattr(torch, dtype))
        torch.mm(a, b)
        n, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < min_s or n == 0:
            torch.mm(a, b)
            n += 1
        return 2.0 * size**3 * n / elapsed
    finally:
        torch.set_num_threads(threads)


HOST_OPTIMIZER_PARAMS = 1 << 25  # 33.5M fp32 parameters: 512 MiB of state, far past any cache (memory-bound)


def host_optimizer_s_per_param(params: int = HOST_OPTIMIZER_PARAMS, tensors: int = 4, min_s: float = 0.3,
                               threads: int = 1) -> float:
    """Seconds per parameter of the host-side Adam step as megatron-core 0.16's HybridDeviceOptimizer
    runs it (`optimizer_cpu_offload`): one `torch.optim.AdamW(fused=True)` over the offloaded shard's
    fp32 master parameters with their fp32 gradients and two fp32 moments (megatron's defaults:
    `overlap_cpu_optimizer_d2h_h2d` off, so one optimizer for every host tensor). Steps repeat for at
    least `min_s` after one warm-up step (which allocates the moments); `threads` torch threads (one:
    a trainer rank's share of the host, as the simulator charges it per rank). The gradient's and
    parameter's trip over PCIe is not in it (there is none on CPU; `deploy.estimate` adds it)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        size = max(1, params // tensors)
        ps = [torch.zeros(size, dtype=torch.float32, requires_grad=True) for _ in range(tensors)]
        for p in ps:
            p.grad = torch.full((size,), 1e-3)
        opt = torch.optim.AdamW([{"params": ps}], lr=1e-4, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8,
                                fused=True)
        opt.step()
        n, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < min_s or n == 0:
            opt.step()
            n += 1
        return elapsed / (n * size * tensors)
    finally:
        torch.set_num_threads(before)
