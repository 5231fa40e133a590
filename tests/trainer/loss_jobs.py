"""Bodies of the multi-rank loss tests (entropy over TP, aggregation over layouts, KL control, padded
junk); each runs in spawned processes (see helpers.run_ranks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.trainer.helpers import make_batch, trainer_config

# entropy bonus, adaptive KL in the loss, per-sequence aggregation: every new term on at once
LOSS_RL = {"entropy_coeff": 0.01, "kl_coef": 0.05, "kl_ctrl_type": "adaptive", "kl_target": 0.002,
           "kl_horizon": 40.0, "loss_agg_mode": "seq-mean-token-mean", "kl_penalty": "low_var_kl"}


def _worker(model_dir: str, rank: int, world: int, port: int, fields: dict[str, Any]) -> Any:
    from asp_npu.trainer.worker import TrainerWorker

    cfg = trainer_config(Path(model_dir))
    for k, v in {**LOSS_RL, **fields}.items():
        setattr(cfg.actor_config if hasattr(cfg.actor_config, k) else cfg.rl_config, k, v)
    return TrainerWorker(cfg, rank, world, master_port=port)


def probe_entropy(w: Any, seed: int = 99) -> dict[int, list[float]]:
    """Per-token entropy of every response token of a probe batch (DP=1: every rank sees all samples)."""
    import torch

    from asp_npu.trainer.batching import Sample

    batch = make_batch(seed=seed)
    samples = [Sample(i, list(t.prompt_token_ids) + list(t.response_token_ids), len(t.prompt_token_ids), 0.0,
                      [0.0] * len(t.response_token_ids)) for i, t in enumerate(batch.trajectories)]
    micro = w._my_micro_batches(samples)
    out: dict[int, list[float]] = {}
    with torch.no_grad():
        store = w._run_schedule(w.model, micro,
                                lambda k, mb, logp, entropy: (logp.sum() * 0, {"ent": entropy}),
                                forward_only=True, with_entropy=True)
    for mb, st in zip(micro, store, strict=True):
        for j, idx in enumerate(mb["index"].tolist()):
            out[idx] = st["ent"][j][mb["mask"][j] > 0].tolist()
    return out


def loss_parity(rank: int, world: int, port: int, model_dir: str, setups: dict[str, dict[str, Any]],
                steps: int = 3) -> dict[str, Any]:
    """For each named setup (actor_config / rl_config fields over LOSS_RL): the probe entropies before
    training (DP=1 setups) and the metrics of `steps` GRPO steps."""
    out: dict[str, Any] = {}
    for name, fields in setups.items():
        w = _worker(model_dir, rank, world, port, fields)
        res: dict[str, Any] = {}
        if w.layout.dp == 1:
            res["entropy"] = probe_entropy(w)
        res["metrics"] = [w.train_step(make_batch(seed=i)) for i in range(steps)]
        out[name] = res
    return out


def padded_junk(rank: int, world: int, port: int, model_dir: str) -> dict[str, Any]:
    """One step on a batch whose padded positions hold extreme behaviour logprobs, advantages and
    reference logprobs, next to the same step without them: the weights after it."""
    import numpy as np

    out: dict[str, Any] = {}
    for name in ("clean", "junk"):
        w = _worker(model_dir, rank, world, port, {})
        junked = [0]
        if name == "junk":
            micro_batches, forward = w._my_micro_batches, w._forward_logprobs

            def junk_micro(samples: Any, mbs: Any = micro_batches, junked: list[int] = junked) -> Any:
                out_mbs = mbs(samples)
                for mb in out_mbs:
                    pad = mb["mask"] == 0
                    junked[0] += int(pad.sum())
                    mb["behav"] = mb["behav"].masked_fill(pad, -float("inf"))
                    mb["adv"] = mb["adv"].masked_fill(pad, float("nan"))
                return out_mbs

            def junk_ref(model: Any, micro: Any, fwd: Any = forward) -> Any:
                return [lp.masked_fill(mb["mask"] == 0, 1e30)
                        for lp, mb in zip(fwd(model, micro), micro, strict=False)]

            w._my_micro_batches, w._forward_logprobs = junk_micro, junk_ref
        metrics = w.train_step(make_batch(seed=0))
        weights = {k: np.asarray(v) for k, v in w.get_hf_weights().tensors.items()}
        out[name] = {"metrics": metrics, "weights": weights, "junked_positions": junked[0],
                     "finite": bool(all(np.isfinite(v).all() for v in weights.values()))}
    return out


def kl_resume(rank: int, world: int, port: int, model_dir: str, ckpt: str) -> dict[str, Any]:
    """Two adaptive-KL steps, save; a fresh trainer loads the checkpoint: its coefficient and next
    step's metrics against the uninterrupted trainer's."""
    w = _worker(model_dir, rank, world, port, {})
    for i in range(2):
        w.train_step(make_batch(seed=i))
    w.save(ckpt)
    saved = w.kl_ctrl.value
    uninterrupted = w.train_step(make_batch(seed=2))
    r = _worker(model_dir, rank, world, port, {})
    fresh = r.kl_ctrl.value
    r.load(ckpt)
    return {"saved": saved, "fresh": fresh, "loaded": r.kl_ctrl.value, "uninterrupted": uninterrupted,
            "resumed": r.train_step(make_batch(seed=2))}
