"""Bodies of the checkpoint-in/out tests (spawned ranks, see helpers.run_ranks); the bench reuses them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tests.trainer.helpers import make_batch, trainer_config
from tests.trainer.jobs import _full_logits

ITERATION = 7


def _ids() -> Any:
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randint(1, 200, (2, 19), generator=g)


def _perturb(module: Any, tp_rank: int, pp_rank: int) -> None:
    """Move every weight off the HF source, differently on each TP shard and equally on the copies
    megatron keeps of a replicated one, so the checkpoint is this megatron model's own weights."""
    import torch

    with torch.no_grad():
        for i, p in enumerate(module.parameters()):
            sharded = bool(getattr(p, "tensor_model_parallel", False))
            g = torch.Generator().manual_seed(1000 * pp_rank + 10 * i + (tp_rank if sharded else 0))
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def _pipeline_logits(worker: Any, ids: Any) -> Any:
    """Full-vocabulary logits of a PP=2 model: stage 0's hidden states go to stage 1 point to point."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    pos = torch.arange(ids.shape[1]).unsqueeze(0).expand(ids.shape[0], -1)
    m = worker.module
    with torch.no_grad():
        if ps.is_pipeline_first_stage():
            hidden = m(ids, pos, None)
            dist.send(hidden.contiguous(), ps.get_pipeline_model_parallel_next_rank())
            return None
        hidden = torch.empty(ids.shape[1], ids.shape[0], worker.dims.hidden_size)
        dist.recv(hidden, ps.get_pipeline_model_parallel_prev_rank())
        m.set_input_tensor(hidden)
        logits = gather_from_tensor_model_parallel_region(m(ids, pos, None))
        return logits[..., :worker.dims.vocab_size]


def write_megatron_fixture(rank: int, world: int, port: int, model_dir: str, legacy: str,
                           dist_root: str) -> Any:
    """TP=2 x PP=2 megatron-core model (4 gloo ranks): its weights written (1) in Megatron-LM's legacy
    layout, each rank's `state_dict_for_save_checkpoint()` torch.save'd as
    iter_0000007/mp_rank_TT_PPP/model_optim_rng.pt (megatron-core has no legacy writer; this is what
    Megatron-LM's save_checkpoint puts there), and (2) as a megatron-core dist checkpoint through
    `dist_checkpointing.save` of its sharded state dict; returns the model's own logits (last stage)."""
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps

    from asp_npu.data.megatron_folder import LEGACY_FILE, TRACKER
    from asp_npu.trainer.worker import TrainerWorker

    w = TrainerWorker(trainer_config(Path(model_dir), tp=2, pp=2), rank, world, master_port=port)
    tp, pp = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    _perturb(w.module, tp, pp)
    it = Path(legacy) / f"iter_{ITERATION:07d}" / f"mp_rank_{tp:02d}_{pp:03d}"
    it.mkdir(parents=True, exist_ok=True)
    args = argparse.Namespace(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                              expert_model_parallel_size=1, num_layers=w.dims.num_layers)
    torch.save({"model": w.module.state_dict_for_save_checkpoint(), "args": args, "iteration": ITERATION,
                "checkpoint_version": 3.0}, it / LEGACY_FILE)
    d = Path(dist_root) / f"iter_{ITERATION:07d}"
    if rank == 0:
        d.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(w.module.sharded_state_dict(), str(d))
    dist.barrier()
    if rank == 0:
        (Path(legacy) / TRACKER).write_text(str(ITERATION))
        (Path(dist_root) / TRACKER).write_text(str(ITERATION))
    logits = _pipeline_logits(w, _ids())
    dist.barrier()
    return None if logits is None or tp else logits.numpy()  # tensors do not outlive their process


def initial_policy_logits(rank: int, world: int, port: int, model_dir: str, load: str, tp: int = 1) -> Any:
    """Logits of a trainer (TP=`tp`, PP=1) whose initial policy is the Megatron folder `load`, named by
    `actor_config.load` as a MindSpeed-RL config names it."""
    from asp_npu.config import foreign_load
    from asp_npu.trainer.worker import TrainerWorker

    cfg = trainer_config(Path(model_dir), tp=tp)
    cfg.actor_config.load = load
    cfg = foreign_load(cfg)
    assert cfg.model.load_megatron == load and not cfg.actor_config.load
    w = TrainerWorker(cfg, rank, world, master_port=port)
    return _full_logits(w, _ids()).numpy()


def trained_checkpoint(rank: int, world: int, port: int, model_dir: str, ckpt: str,
                       dtype: str = "float32") -> Any:
    """Two GRPO steps at TP=2 (bf16 or fp32), a checkpoint through the trainer's own save; returns the
    trainer's full logits after them."""
    from asp_npu.trainer.worker import TrainerWorker

    cfg = trainer_config(Path(model_dir), tp=2)
    cfg.model.dtype = dtype
    w = TrainerWorker(cfg, rank, world, master_port=port)
    for seed in (0, 1):
        w.train_step(make_batch(seed=seed))
    w.save(ckpt)
    logits = _full_logits(w, _ids()).float().numpy()  # a TP collective: every rank runs it
    return logits if rank == 0 else None
