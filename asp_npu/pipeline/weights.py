"""Weights: the one seam between the trainer's new weights and the rollout instances.

    gather   the trainer's full weights, on the trainer thread right after its step (trainer paused)
    publish  make version v available to the instances, once
    refresh  start loading the published version on every instance behind it (one load in flight per
             instance; `drain` finishes running sequences on the old weights first, else in flight)
    poll     collect finished loads: which instance now holds which version, and how long it paused

`WeightSync` is the interface the controller drives; `ObjectStoreWeights` is today's transport (HF
safetensors bytes put once in Ray's object store, each instance pulls and loads them through
`RolloutInstance.refresh_weights`). Another transport (e.g. vLLM's weight-transfer engine) plugs in by
implementing the same methods; the controller, the dispatch policy and the recorder do not change.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

POLL_S = 0.01  # polling while every instance is brought to new weights (short, rare)
REFRESH_S = 660.0  # the longest every instance may take to drain (`vllm_engine.DRAIN_S`) and load


@dataclass(frozen=True)
class Gathered:
    payload: Any
    t0: float  # when gathering started / ended (the trainer is paused meanwhile)
    t1: float


@dataclass(frozen=True)
class Refreshed:
    """One finished load: `instance` holds `version` since `t_end`, after `load_s` paused."""

    instance: int
    version: int
    t_end: float
    load_s: float
    report: dict[str, Any]


class WeightSync(Protocol):
    held: list[int]  # weights version each instance holds
    published: int  # latest published version

    def gather(self) -> Gathered: ...
    def publish(self, gathered: Gathered, version: int) -> None: ...
    def refresh(self) -> None: ...
    def pending(self) -> list[Any]: ...  # handles the controller may block on (Ray refs)
    def poll(self) -> list[Refreshed]: ...


class ObjectStoreWeights:
    """Safetensors bytes through Ray's object store (`ray.put` once, every instance pulls)."""

    def __init__(self, trainer: Any, instances: list[Any], dtype: str, drain: bool) -> None:
        self.trainer, self.instances, self.dtype, self.drain = trainer, instances, dtype, drain
        self.held = [0] * len(instances)
        self.published = 0
        self._ref: Any = None
        self._loading: list[tuple[Any, int] | None] = [None] * len(instances)

    def gather(self) -> Gathered:
        t0 = time.time()
        blob = self.trainer.get_hf_weights().to_safetensors_bytes(self.dtype)
        return Gathered(blob, t0, time.time())

    def publish(self, gathered: Gathered, version: int) -> None:
        import ray

        self._ref = ray.put(gathered.payload)
        self.published = version

    def refresh(self) -> None:
        for i, inst in enumerate(self.instances):
            if self._loading[i] is None and self._ref is not None and self.held[i] < self.published:
                self._loading[i] = (inst.refresh_weights.remote(self._ref, self.published, self.drain),
                                    self.published)

    def pending(self) -> list[Any]:
        return [x[0] for x in self._loading if x is not None]

    def poll(self) -> list[Refreshed]:
        import ray

        from asp_npu.remote import CALL_S, get

        out = []
        for i, loading in enumerate(self._loading):
            if loading is None:
                continue
            ref, v = loading
            ready, _ = ray.wait([ref], timeout=0)
            if ready:
                rep = get(ref, CALL_S, f"rollout instance {i}", "refresh_weights")
                load = max(0.0, float(rep["total_s"]) - float(rep["drain_s"]))
                out.append(Refreshed(i, v, time.time(), load, rep))
                self.held[i] = v
                self._loading[i] = None
        return out


def refresh_all_and_wait(weights: WeightSync, on_done: Any, timeout: float = REFRESH_S) -> None:
    """Bring every instance to the published weights before generating (sync modes, resume)."""
    weights.refresh()
    deadline = time.monotonic() + timeout
    while weights.pending():
        if time.monotonic() > deadline:
            from asp_npu.remote import ActorTimeout

            raise ActorTimeout("rollout instances", f"weight refresh not done within {timeout:.0f}s "
                               f"({len(weights.pending())} instance(s) still loading)")
        for r in weights.poll():
            on_done(r)
        time.sleep(POLL_S)
