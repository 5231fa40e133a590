"""Bodies of the critic tests (PPO's value model over megatron-core/gloo); each runs in spawned
processes (see helpers.run_ranks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.trainer.helpers import make_batch, trainer_config


def critic_config(model_dir: str, **critic: Any) -> Any:
    cfg = trainer_config(Path(model_dir))
    cfg.rl_config.adv_estimator = "gae"
    cfg.rl_config.gamma, cfg.rl_config.lam, cfg.rl_config.cliprange_value = 0.99, 0.95, 0.2
    c = cfg.critic_config
    c.micro_batch_size, c.lr, c.clip_grad = 3, 1e-3, 1.0
    for k, v in critic.items():
        setattr(c, k, v)
    return cfg


def critic_parity(rank: int, world: int, port: int, model_dir: str, critic: dict[str, Any],
                  steps: int = 3) -> dict[str, Any]:
    """`steps` critic updates (score, GAE, update) on made-up batches, then the values of a probe batch."""
    from asp_npu.trainer.critic import CriticWorker, gae_rows

    w = CriticWorker(critic_config(model_dir, **critic), rank, world, master_port=port)
    metrics, versions = [], []
    for i in range(steps):
        batch = make_batch(seed=i)
        values, version = w.values(batch)
        versions.append(version)
        _adv, returns = gae_rows(batch, values, 0.99, 0.95)
        metrics.append(w.critic_step(batch, values, returns))
    probe, _ = w.values(make_batch(seed=99))
    head = w.module.output_layer.weight.detach().abs().sum().item() if w.module.post_process else None
    w.shutdown()
    return {"metrics": metrics, "probe": probe, "versions": versions, "head_abs": head}


def critic_checkpoint(rank: int, world: int, port: int, model_dir: str, ckpt: str) -> dict[str, Any]:
    """Two critic updates, a checkpoint, a fresh critic loading it: its values and next update match."""
    from asp_npu.trainer.critic import CriticWorker, gae_rows

    def update(w: Any, seed: int) -> dict[str, float]:
        batch = make_batch(seed=seed)
        values, _ = w.values(batch)
        return w.critic_step(batch, values, gae_rows(batch, values, 0.99, 0.95)[1])

    a = CriticWorker(critic_config(model_dir), rank, world, master_port=port)
    update(a, 0)
    update(a, 1)
    a.save(ckpt)
    probe_a = a.values(make_batch(seed=99))
    next_a = update(a, 2)
    b = CriticWorker(critic_config(model_dir), rank, world, master_port=port)
    fresh = b.values(make_batch(seed=99))
    b.load(ckpt)
    return {"probe_a": probe_a, "probe_b": b.values(make_batch(seed=99)), "fresh": fresh,
            "next_a": next_a, "next_b": update(b, 2)}
