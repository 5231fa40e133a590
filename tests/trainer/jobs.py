"""Bodies of the multi-rank trainer tests; each runs in spawned processes (see helpers.run_ranks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.trainer.helpers import make_batch, trainer_config


def _full_logits(worker: Any, ids: Any) -> Any:
    """Megatron logits gathered over TP, vocabulary padding cut off (PP=1 only)."""
    import torch
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    pos = torch.arange(ids.shape[1]).unsqueeze(0).expand(ids.shape[0], -1)
    with torch.no_grad():
        local = worker.model(ids, pos, None)
        return gather_from_tensor_model_parallel_region(local)[..., :worker.dims.vocab_size]


def _hf_logits(model_dir: str, ids: Any) -> Any:
    import torch
    from transformers import Qwen2ForCausalLM

    hf = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(ids).logits


def parity_and_losses(rank: int, world: int, port: int, tied_dir: str, untied_dir: str,
                      layouts: list[tuple[int, int, int]]) -> dict[str, Any]:
    """For each (tp, pp, dp): losses of two GRPO steps on both models; HF logit error when pp == 1."""
    import torch

    from asp_npu.trainer.worker import TrainerWorker

    torch.manual_seed(0)
    ids = torch.randint(1, 200, (2, 19))
    out: dict[str, Any] = {}
    for name, d in (("tied", tied_dir), ("untied", untied_dir)):
        ref = _hf_logits(d, ids)
        for tp, pp, dp in layouts:
            w = TrainerWorker(trainer_config(Path(d), tp, pp, dp), rank, world, master_port=port)
            key = f"{name}/tp{tp}pp{pp}dp{dp}"
            if pp == 1:
                out[key + "/logit_err"] = float((_full_logits(w, ids) - ref).abs().max())
            batch = make_batch()
            out[key + "/losses"] = [w.train_step(batch)["loss"] for _ in range(2)]
    return out


def grpo_direction(rank: int, world: int, port: int, model_dir: str) -> dict[str, Any]:
    """One GRPO step on a hand-made batch; logprobs of every sample before and after."""
    from asp_npu.trainer.worker import TrainerWorker
    from asp_npu.types import TrainBatch, Trajectory

    cfg = trainer_config(Path(model_dir), 1, 1, 1)
    cfg.actor_config.lr = 2e-3
    w = TrainerWorker(cfg, rank, world, master_port=port)
    prompt = [5, 17, 42, 9]
    responses = [[11, 12, 13], [21, 22, 23, 24], [31, 32], [41, 42, 43]]
    rewards = [1.0, 1.0, 0.0, 0.0]  # group-normalised: two positive, two negative advantages
    probe = TrainBatch([Trajectory("p", i, prompt, r, [0.0] * len(r), "stop", 0.0, 0)
                        for i, r in enumerate(responses)], group_size=4)
    before = w.compute_logprobs(probe)
    trajs = [Trajectory("p", i, prompt, r, lp, "stop", rew, 0)
             for i, (r, lp, rew) in enumerate(zip(responses, before, rewards, strict=True))]
    metrics = w.train_step(TrainBatch(trajs, group_size=4))
    after = w.compute_logprobs(probe)
    return {"before": before, "after": after, "rewards": rewards, "metrics": metrics}


def grpo_options(rank: int, world: int, port: int, model_dir: str) -> dict[str, Any]:
    """KL to the reference, two PPO epochs, DAPO group dropping and truncated importance weights."""
    from asp_npu.trainer.worker import TrainerWorker

    cfg = trainer_config(Path(model_dir), 1, 1, 1, kl_coef=0.1, ppo_epochs=2, drop_equal_reward_groups=True,
                         importance_cap=2.0)
    cfg.actor_config.lr = 5e-3
    w = TrainerWorker(cfg, rank, world, master_port=port)
    batch = make_batch(groups=3, behaviour_shift=-3.0)  # rollout logprobs far below: weights e^3 > cap
    for t in batch.trajectories[:4]:
        t.reward = 1.0  # group p0: all equal -> dropped
    first = w.train_step(batch)
    for t in batch.trajectories:
        t.reward = 0.0
    skipped = w.train_step(batch)
    bf16_cfg = trainer_config(Path(model_dir), 1, 1, 1)
    bf16_cfg.model.dtype = "bfloat16"
    bf16 = TrainerWorker(bf16_cfg, rank, world, master_port=port)
    bf16_losses = [bf16.train_step(make_batch())["loss"] for _ in range(2)]
    master_dtype = str(bf16.master[0].dtype)
    return {"first": first, "skipped": skipped, "version": w.version, "bf16_losses": bf16_losses,
            "bf16_master": master_dtype}
