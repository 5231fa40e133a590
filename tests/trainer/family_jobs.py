"""Bodies of the model-family trainer tests (Qwen3, Qwen3-MoE, Llama); run in spawned processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.trainer.helpers import make_batch, trainer_config


def full_logits(worker: Any, ids: Any) -> Any:
    """Megatron logits gathered over TP, vocabulary padding cut off (PP=1 only)."""
    import torch
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    pos = torch.arange(ids.shape[1]).unsqueeze(0).expand(ids.shape[0], -1)
    worker.model.eval()  # megatron refuses MoE + TP without sequence parallel in training mode only
    with torch.no_grad():
        local = worker.model(ids, pos, None)
        return gather_from_tensor_model_parallel_region(local)[..., :worker.dims.vocab_size]


def hf_logits(model_dir: str, ids: Any) -> Any:
    """HF reference logits; call before building a trainer in the process (see `parity`)."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(ids).logits


def parity(rank: int, world: int, port: int, model_dirs: list[str], tp: int) -> dict[str, Any]:
    """Per model: max |megatron - HF| logits at TP=`tp` (DP fills the world), and whether the weights
    gathered back to HF names equal the HF folder's exactly."""
    import torch

    from asp_npu.trainer.convert import megatron_stage_to_hf, read_hf_state
    from asp_npu.trainer.worker import TrainerWorker

    torch.manual_seed(0)
    ids = torch.randint(1, 200, (2, 23))
    refs = [hf_logits(d, ids) for d in model_dirs]  # first: HF loaded after cpu_compat.install() has bad RoPE
    out = {}
    for d, ref in zip(model_dirs, refs, strict=True):
        w = TrainerWorker(trainer_config(Path(d), tp, 1, world // tp), rank, world, master_port=port)
        err = float((full_logits(w, ids) - ref).abs().max())
        back = megatron_stage_to_hf(w.module, w.dims)
        hf = read_hf_state(d)
        if w.dims.tie_word_embeddings:
            hf.pop("lm_head.weight", None)
        exact = sorted(back) == sorted(hf) and all(torch.equal(back[k], hf[k]) for k in hf)
        out[d] = {"logit_err": err, "roundtrip_exact": exact}
    return out


def grpo_directions(rank: int, world: int, port: int, model_dirs: list[str]) -> dict[str, Any]:
    """tests.trainer.jobs.grpo_direction for each model (one process)."""
    from tests.trainer.jobs import grpo_direction

    return {d: grpo_direction(rank, world, port, d) for d in model_dirs}


def ep_run(rank: int, world: int, port: int, model_dir: str, ep: int, steps: int = 3) -> dict[str, Any]:
    """`steps` GRPO updates at DP=world, EP=`ep` (fp32): losses, grad norms, final gradients and weights."""
    from asp_npu.trainer.convert import megatron_stage_to_hf, to_numpy
    from asp_npu.trainer.worker import TrainerWorker

    cfg = trainer_config(Path(model_dir), 1, 1, world)
    cfg.actor_config.expert_model_parallel_size = ep
    w = TrainerWorker(cfg, rank, world, master_port=port)
    metrics = [w.train_step(make_batch(groups=4, seed=s)) for s in range(steps)]
    grads = {n: p.main_grad for n, p in w.module.named_parameters()}  # DDP's reduced fp32 grads
    out = {"losses": [m["loss"] for m in metrics], "grad_norms": [m["grad_norm"] for m in metrics],
           "aux": [m["moe_aux_loss"] for m in metrics],
           "grads": to_numpy(megatron_stage_to_hf(w.module, w.dims, grads)),
           "weights": to_numpy(megatron_stage_to_hf(w.module, w.dims))}
    w.shutdown()
    return out if rank == 0 else {}


def moe_layout_run(rank: int, world: int, port: int, model_dir: str, fields: dict[str, Any],
                   steps: int = 3) -> dict[str, Any]:
    """`steps` fp32 GRPO updates of the MoE model with these actor_config `fields`: losses, grad norms
    and this rank's stage gradients (HF names, gathered over TP/EP) before each optimizer step."""
    from asp_npu.trainer.convert import megatron_stage_to_hf, to_numpy
    from asp_npu.trainer.worker import TrainerWorker

    cfg = trainer_config(Path(model_dir))
    for k, v in fields.items():
        setattr(cfg.actor_config, k, v)
    w = TrainerWorker(cfg, rank, world, master_port=port)
    grads: list[dict[str, Any]] = []
    step = w.optimizer.step

    def capturing_step() -> Any:
        grads.append(to_numpy(megatron_stage_to_hf(
            w.module, w.dims, {n: p.main_grad for n, p in w.module.named_parameters()})))
        return step()

    w.optimizer.step = capturing_step
    metrics = [w.train_step(make_batch(groups=4, seed=s)) for s in range(steps)]
    w.shutdown()
    return {"losses": [m["loss"] for m in metrics], "grad_norms": [m["grad_norm"] for m in metrics],
            "grads": grads}
