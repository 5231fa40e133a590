"""Validation while training (verl `trainer.test_freq` + `data.val_files`): score a held-out set.

Every `trainer.test_freq` trainer steps, and after the last one, the controller sends the held-out
prompts (`asp_npu.data.datasets.config_val_prompts`) to the run's own rollout instances (vLLM, with the
weights they hold then), round-robin, beside the planned work and outside the TrainQueue: validation
never enters the lag ledger or the trainer. Sampling follows `generate_config.val_kwargs` (greedy
unless `do_sample`). The engine scores each sample with the reward function of its row's
`data_source`; this module turns them into per-source metrics:
`val/reward/<source>` (mean reward), `val/acc/<source>` (share of samples scoring >= 1, i.e. exactly
right), the same over all sources as `val/reward/all`, `val/acc/all`, and `val/samples`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from asp_npu.rollout.engine import SamplingSettings
from asp_npu.types import PromptItem, Trajectory

VAL_PREFIX = "val/"
VAL_TIMEOUT_S = 1800.0  # longest wait for one validation pass (every remote wait has a timeout)


def val_sampling(cfg: Any) -> SamplingSettings:
    """`generate_config.val_kwargs` as engine sampling settings (temperature 0 = greedy)."""
    vk, sc = cfg.generate_config.val_kwargs, cfg.generate_config.sampling_config
    return SamplingSettings(n=vk.n, temperature=vk.temperature if vk.do_sample else 0.0,
                            top_p=vk.top_p if vk.do_sample else 1.0, max_tokens=sc.max_tokens,
                            seed=cfg.data.seed)


def val_due(step: int, total: int, test_freq: int) -> bool:
    """Validate after trainer step `step`: every `test_freq` steps and after the last (verl's rule)."""
    return test_freq > 0 and step > 0 and (step % test_freq == 0 or step == total)


def val_metrics(items: Sequence[PromptItem], trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Mean reward and accuracy per data source (and over all) of validation samples."""
    source = {it.prompt_id: str(it.meta.get("data_source") or "unknown") for it in items}
    by: dict[str, list[float]] = {}
    for t in trajs:
        by.setdefault(source.get(t.prompt_id, "unknown"), []).append(float(t.reward))
    out: dict[str, float] = {}
    every = [r for rs in by.values() for r in rs]
    for name, rs in [*sorted(by.items()), ("all", every)]:
        if rs:
            out[f"{VAL_PREFIX}reward/{name}"] = sum(rs) / len(rs)
            out[f"{VAL_PREFIX}acc/{name}"] = sum(r >= 1.0 for r in rs) / len(rs)
    out[f"{VAL_PREFIX}samples"] = float(len(every))
    return out


class Validator:
    """The run's held-out set and when to score it: after `mark` says a step is due, `run` scores it on
    `fleet`'s instances and hands the row to `log` (a colocated run runs it once its engines wake)."""

    def __init__(self, cfg: Any, fleet: Any, log: Callable[[dict[str, Any]], None]) -> None:
        from asp_npu.data.datasets import config_val_prompts

        self.cfg, self.fleet, self.log = cfg, fleet, log
        self.items = config_val_prompts(cfg.data) if cfg.trainer.test_freq > 0 else []
        self.due = False

    def mark(self, step: int, total: int) -> bool:
        """Trainer step `step` finished: True (and due) when validation follows it."""
        self.due = self.due or val_due(step, total, self.cfg.trainer.test_freq)
        return self.due

    def run(self, held: Sequence[int]) -> None:
        """Score the held-out set now (`held`: the weights step each instance holds)."""
        self.due, t0 = False, time.time()
        trajs = run_validation(self.fleet.instances, self.fleet.names(), self.items, val_sampling(self.cfg))
        self.log({**val_metrics(self.items, trajs), "timing/validation": time.time() - t0,
                  "val/weights_step": min(held)})


def run_validation(instances: Sequence[Any], names: Sequence[str], items: Sequence[PromptItem],
                   sampling: SamplingSettings, timeout: float = VAL_TIMEOUT_S) -> list[Trajectory]:
    """Generate `items` on the rollout instance actors (round-robin), waiting at most `timeout`."""
    from asp_npu.remote import get

    shares = [list(items[i::len(instances)]) for i in range(len(instances))]
    refs, who = [], []
    for inst, name, share in zip(instances, names, shares, strict=True):
        if share:
            refs.append(inst.generate_items.remote(share, sampling))
            who.append(name)
    return [t for ts in get(refs, timeout, who, "validation") for t in ts]
