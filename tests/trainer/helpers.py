"""Shared helpers for trainer tests: a tiny random Qwen2 HF folder, hand-made batches, multi-rank runs."""

from __future__ import annotations

import os
import random
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asp_npu.config import Config
from asp_npu.types import TrainBatch, Trajectory

VOCAB = 203  # odd on purpose: TP=2 needs vocabulary padding


def make_hf_model(out: Path, tied: bool, seed: int = 0, layers: int = 2, arch: str = "qwen2") -> Path:
    """A random HF model of family `arch` (GQA 4 heads / 2 kv heads) saved as an HF folder.

    Biases, norms (q/k norms included) and routers are perturbed away from their initial values, so a
    converter that swaps or drops one of them changes the logits."""
    import torch

    from asp_npu.data.init_model import _hf_classes

    config_cls, model_cls = _hf_classes(arch)
    extra: dict[str, Any] = {}
    if arch in ("qwen3", "qwen3-moe"):
        extra["head_dim"] = 16
    if arch == "qwen3-moe":
        extra.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
    cfg = config_cls(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                     tie_word_embeddings=tied, rms_norm_eps=1e-6,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **extra)
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith("mlp.gate.weight"):  # a random router with clear top-k choices
                p.mul_(20.0)
    model.save_pretrained(out)
    return out


def make_batch(groups: int = 3, group_size: int = 4, seed: int = 0, version: int = 0,
               behaviour_shift: float = 0.0) -> TrainBatch:
    """Groups with varied prompt/response lengths and rewards; behaviour logprobs are made up."""
    rng = random.Random(seed)
    trajs = []
    for g in range(groups):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(3, 8))]
        for s in range(group_size):
            resp = [rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 12))]
            trajs.append(Trajectory(
                prompt_id=f"p{g}", sample_idx=s, prompt_token_ids=prompt, response_token_ids=resp,
                logprobs=[-5.3 + behaviour_shift + 0.1 * rng.random() for _ in resp], finish_reason="stop",
                reward=float(rng.random() < 0.5) + 0.1 * s, policy_version=version))
    return TrainBatch(trajectories=trajs, group_size=group_size)


def trainer_config(model_dir: Path, tp: int = 1, pp: int = 1, dp: int = 1, **rl: Any) -> Config:
    cfg = Config()
    cfg.model.path = str(model_dir)
    cfg.trainer.device = "cpu"
    a = cfg.actor_config
    a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.data_parallel_size = tp, pp, dp
    a.micro_batch_size, a.lr, a.clip_grad, a.num_threads = 3, 1e-3, 1.0, 1
    for k, v in rl.items():
        target = cfg.actor_config if hasattr(cfg.actor_config, k) else cfg.rl_config
        setattr(target, k, v)
    return cfg


# packed micro-batches (use_remove_padding) and their padded references, on two ranks
PACKED_SETUPS: dict[str, dict[str, Any]] = {
    "TP1 DP2": {"data_parallel_size": 2},
    "TP1 DP2 packed dynbsz": {"data_parallel_size": 2, "use_remove_padding": True, "use_dynamic_bsz": True,
                              "ppo_max_token_len_per_gpu": 40},
    "TP2 DP1 SP": {"tensor_model_parallel_size": 2, "sequence_parallel": True},
    "TP2 DP1 SP packed": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                          "use_remove_padding": True},
    "PP2": {"pipeline_model_parallel_size": 2},
    "PP2 packed": {"pipeline_model_parallel_size": 2, "use_remove_padding": True},
}
PACKED_PAIRS = [("TP1 DP2 packed dynbsz", "TP1 DP2"), ("TP2 DP1 SP packed", "TP2 DP1 SP"),
                ("PP2 packed", "PP2")]


def parity_figures(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """Max |difference| of losses, gradients (the keys `a` holds: a pipeline stage's) and log-probs
    between two `jobs.training_parity` results."""
    import numpy as np

    return {"max_loss_diff": max(abs(x - y) for x, y in zip(a["losses"], b["losses"], strict=True)),
            "max_grad_diff": max(float(np.abs(ga[k] - gb[k]).max())
                                 for ga, gb in zip(a["grads"], b["grads"], strict=True) for k in ga),
            "max_logprob_diff": max(abs(x - y) for la, lb in zip(a["logprobs"], b["logprobs"], strict=True)
                                    for x, y in zip(la, lb, strict=True))}


def _entry(rank: int, world: int, port: int, fn: Callable, args: tuple, queue: Any) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
                       "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    try:
        import torch

        torch.set_num_threads(1)
        queue.put((rank, "ok", fn(rank, world, port, *args)))
    except BaseException:  # noqa: BLE001  (report any failure to the parent)
        queue.put((rank, "error", traceback.format_exc()))


# A rank that fails with one of these lost its rendezvous to another process on this busy machine (a port
# freed by `free_port` and taken before rank 0 bound it, or a peer's listener gone): the run is retried
# once on a new port; any other failure is the test's.
_TRANSPORT_ERRORS = ("Gloo connectFullMesh failed", "Address already in use", "EADDRINUSE")


def run_ranks(world: int, fn: Callable, *args: Any, timeout: float = 240.0) -> list[Any]:
    """Run `fn(rank, world, port, *args)` in `world` fresh spawned processes; returns results by rank."""
    try:
        return _run_ranks_once(world, fn, args, timeout)
    except AssertionError as err:
        if not any(marker in str(err) for marker in _TRANSPORT_ERRORS):
            raise
        return _run_ranks_once(world, fn, args, timeout)


def _run_ranks_once(world: int, fn: Callable, args: tuple, timeout: float) -> list[Any]:
    import multiprocessing as mp

    from asp_npu.net import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world):
            rank, status, value = queue.get(timeout=timeout)
            if status == "error":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(world)]
