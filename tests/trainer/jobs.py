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
    from asp_npu.trainer.memory import torch_optimizers

    master_dtype = str(torch_optimizers(bf16.optimizer)[0].param_groups[0]["params"][0].dtype)
    return {"first": first, "skipped": skipped, "version": w.version, "bf16_losses": bf16_losses,
            "bf16_master": master_dtype}


def _full_grads(worker: Any) -> dict[str, Any]:
    """The reduced (pre-clip) gradients in HF names and full shapes; the distributed optimizer's
    reduce-scatter left each DP x CP rank its own shard of every bucket, so the shards are gathered first."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from asp_npu.trainer.convert import megatron_stage_to_hf

    dp = ps.get_data_parallel_world_size(with_context_parallel=True)  # megatron shards over DP x CP
    if worker.cfg.actor_config.use_distributed_optimizer and dp > 1:
        for buf in worker.model.buffers:
            for bucket in buf.buckets:
                shards = list(bucket.grad_data.view(dp, -1).unbind(0))
                mine = shards[ps.get_data_parallel_rank(with_context_parallel=True)].clone()
                dist.all_gather(shards, mine, group=ps.get_data_parallel_group(with_context_parallel=True))
    grads = {name: p.main_grad.detach().clone() for name, p in worker.module.named_parameters()}
    return {k: v.numpy() for k, v in megatron_stage_to_hf(worker.module, worker.dims, grads).items()}


def training_parity(rank: int, world: int, port: int, model_dir: str,
                    setups: dict[str, dict[str, Any]], steps: int = 3) -> dict[str, Any]:
    """For each named setup (actor_config fields): losses of `steps` GRPO steps, the HF-named gradients
    before every optimizer step, and the per-rank allocated bytes after the last step."""
    from asp_npu.trainer.worker import TrainerWorker

    out: dict[str, Any] = {}
    for name, fields in setups.items():
        cfg = trainer_config(Path(model_dir))
        for k, v in fields.items():
            setattr(cfg.model if k == "dtype" else cfg.actor_config, k, v)  # dtype: the model's
        w = TrainerWorker(cfg, rank, world, master_port=port)
        grads: list[dict[str, Any]] = []
        step = w.optimizer.step

        def capturing_step(w: Any = w, step: Any = step, grads: list = grads) -> Any:
            grads.append(_full_grads(w))
            return step()

        w.optimizer.step = capturing_step
        calls = [0]  # core attention forwards: recomputation runs them again during backward
        w.module.decoder.layers[0].self_attention.core_attention.register_forward_hook(
            lambda *_, calls=calls: calls.__setitem__(0, calls[0] + 1))
        losses = [w.train_step(make_batch(seed=i)) for i in range(steps)]
        core = w.module.decoder.layers[0].self_attention.core_attention
        out[name] = {"losses": [m["loss"] for m in losses], "grad_norms": [m["grad_norm"] for m in losses],
                     "grads": grads, "bytes": w.allocated_bytes(),
                     "optimizer_bytes": w.optimizer_bytes(), "core_attn_calls": calls[0],
                     "core_attention": type(core).__name__,
                     "logprobs": w.compute_logprobs(make_batch(seed=99))}
    return out


def reshard_resume(rank: int, world: int, port: int, model_dir: str, ckpt: str,
                   save_layout: tuple[int, ...], load_layout: tuple[int, ...],
                   dist_opt: bool) -> dict[str, Any]:
    """Train at (tp, dp[, cp]) `save_layout`, save, train on; a fresh trainer at `load_layout` loads the
    checkpoint and takes the same next two steps."""
    from asp_npu.trainer.worker import TrainerWorker

    def worker(tp: int, dp: int, cp: int = 1) -> Any:
        cfg = trainer_config(Path(model_dir), tp=tp, dp=dp)
        cfg.actor_config.use_distributed_optimizer = dist_opt
        cfg.actor_config.context_parallel_size = cp
        return TrainerWorker(cfg, rank, world, master_port=port)

    w = worker(*save_layout)
    w.train_step(make_batch(seed=0))
    w.train_step(make_batch(seed=1))
    w.save(ckpt)
    uninterrupted = [w.train_step(make_batch(seed=i)) for i in (2, 3)]
    r = worker(*load_layout)
    meta = r.load(ckpt)
    resumed = [r.train_step(make_batch(seed=i)) for i in (2, 3)]  # the second sees the restored Adam state
    return {"uninterrupted": uninterrupted, "resumed": resumed, "meta": meta, "version": r.version}


def offload_cycle(rank: int, world: int, port: int, model_dir: str) -> dict[str, Any]:
    """A colocated-mode trainer with optimizer, gradients and weights offloaded between updates,
    next to one without offload: what stays allocated, and whether training is unchanged."""
    from asp_npu.trainer.worker import TrainerWorker

    out: dict[str, Any] = {}
    for name, on in (("plain", False), ("offload", True)):
        cfg = trainer_config(Path(model_dir))
        cfg.rl_config.mode = "mindspeed-sync"
        a = cfg.actor_config
        a.offload_train_optimizer = a.offload_train_grad = a.offload_train_param = on
        w = TrainerWorker(cfg, rank, world, master_port=port)
        res: dict[str, Any] = {"initial": w.allocated_bytes(), "losses": [], "between": []}
        for i in range(3):
            res["losses"].append(w.train_step(make_batch(seed=i))["loss"])
            res["between"].append(w.allocated_bytes())
        res["logprobs"] = w.compute_logprobs(make_batch(seed=5))
        res["weights"] = w.get_hf_weights().tensors
        res["after_reads"] = w.allocated_bytes()
        with w._resident():
            res["resident"] = w.allocated_bytes()
        out[name] = res
    return out


def stage_parity(rank: int, world: int, port: int, model_dir: str, stages: list[int],
                 steps: int = 3) -> dict[str, Any]:
    """`steps` GRPO steps at PP=`world` with `stages` layers per stage (PP=1 when world == 1): losses,
    and this stage's HF-named gradients before every optimizer step."""
    from asp_npu.trainer.convert import megatron_layers
    from asp_npu.trainer.worker import TrainerWorker

    cfg = trainer_config(Path(model_dir), pp=world)
    cfg.actor_config.num_layer_list = list(stages)
    w = TrainerWorker(cfg, rank, world, master_port=port)
    grads: list[dict[str, Any]] = []
    step = w.optimizer.step

    def capturing_step() -> Any:
        grads.append(_full_grads(w))
        return step()

    w.optimizer.step = capturing_step
    losses = [w.train_step(make_batch(seed=i))["loss"] for i in range(steps)]
    return {"losses": losses, "grads": grads, "layers": list(megatron_layers(w.module))}


def schedule_and_resume(rank: int, world: int, port: int, model_dir: str, ckpt: str) -> dict[str, Any]:
    """Eight GRPO steps under a warm-up + cosine schedule (2 + 6 iterations, one optimizer step each):
    the lr of every step next to megatron's OptimizerParamScheduler driven by the same literal values;
    a checkpoint after step 4 resumed by a fresh trainer (next two lrs and losses); and the schedule's
    position after 3 steps of ppo_epochs=2."""
    import torch
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    from asp_npu.trainer.worker import TrainerWorker

    def worker(epochs: int = 1) -> Any:
        cfg = trainer_config(Path(model_dir), ppo_epochs=epochs, n_samples_per_prompt=4, mini_batch_size=12)
        a = cfg.actor_config
        a.lr, a.min_lr, a.lr_decay_style, a.lr_warmup_iters, a.adam_beta2 = 1e-3, 1e-4, "cosine", 2, 0.95
        cfg.trainer.train_iters = 8
        return TrainerWorker(cfg, rank, world, master_port=port)

    w = worker()
    lrs, losses = [], []
    for i in range(8):
        m = w.train_step(make_batch(seed=i))
        lrs.append(m["lr"])
        losses.append(m["loss"])
        if i == 3:
            w.save(ckpt)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)
    ref = OptimizerParamScheduler(opt, init_lr=0.0, max_lr=1e-3, min_lr=1e-4, lr_warmup_steps=2,
                                  lr_decay_steps=8, lr_decay_style="cosine", start_wd=0.0, end_wd=0.0,
                                  wd_incr_steps=8, wd_incr_style="constant")
    reference = []
    for _ in range(8):
        reference.append(opt.param_groups[0]["lr"])
        ref.step(increment=1)
    r = worker()
    r.load(ckpt)
    resumed = [r.train_step(make_batch(seed=i)) for i in (4, 5)]
    e = worker(epochs=2)
    for i in range(3):
        e.train_step(make_batch(seed=i))
    return {"lrs": lrs, "losses": losses, "reference": reference, "resumed_lrs": [m["lr"] for m in resumed],
            "resumed_losses": [m["loss"] for m in resumed], "epoch_steps": e.scheduler.num_steps}


def offload_resume(rank: int, world: int, port: int, model_dir: str, ckpt: str,
                   fraction: float) -> dict[str, Any]:
    """Host-resident optimizer (megatron's HybridDeviceOptimizer) through a checkpoint: two steps, save,
    two more; a fresh trainer loads and takes the same two."""
    from asp_npu.trainer.worker import TrainerWorker

    def worker() -> Any:
        cfg = trainer_config(Path(model_dir), use_distributed_optimizer=True, optimizer_cpu_offload=True,
                             optimizer_offload_fraction=fraction)
        return TrainerWorker(cfg, rank, world, master_port=port)

    w = worker()
    for i in (0, 1):
        w.train_step(make_batch(seed=i))
    w.save(ckpt)
    uninterrupted = [w.train_step(make_batch(seed=i))["loss"] for i in (2, 3)]
    r = worker()
    r.load(ckpt)
    resumed = [r.train_step(make_batch(seed=i))["loss"] for i in (2, 3)]
    return {"uninterrupted": uninterrupted, "resumed": resumed}
