"""Weights: the one seam between the trainer's new weights and the rollout instances.

    gather   the trainer's full weights, on the trainer thread right after its step (trainer paused)
    publish  make version v available to the instances, once
    refresh  start loading the published version on every instance behind it (one load in flight per
             instance; `drain` finishes running sequences on the old weights first, else in flight)
    poll     collect finished loads: which instance now holds which version, and how long it paused

`WeightSync` is the interface the controller drives, with two transports chosen by
`generate_config.weight_transfer`:

- `TransferEngineWeights` (`auto`, the default): vLLM's weight-transfer engine (`weights.engine_link`),
  trainer rank 0 broadcasts straight to every instance worker over one process group; nothing to gather.
  A lost instance and its replacement re-form the group (see the class).
- `ObjectStoreWeights` (`object-store`): HF safetensors bytes put once in Ray's object store, each
  instance pulls and loads them through `RolloutInstance.refresh_weights`; needs no process group.

The controller, the dispatch policy and the recorder do not change with the transport.
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
    def lost(self, instance: int) -> None: ...  # its actor died: a load in flight there is void
    def replaced(self, instance: int) -> None: ...  # its replacement is up, holding the initial weights
    def has_published(self) -> bool: ...  # False: every instance still holds the initial weights
    def describe(self) -> dict[str, Any]: ...  # which path the weights travel (summary.json)


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

    def lost(self, instance: int) -> None:
        self._loading[instance] = None

    def replaced(self, instance: int) -> None:
        self.held[instance] = 0

    def has_published(self) -> bool:
        return self._ref is not None

    def describe(self) -> dict[str, Any]:
        return {"path": "object-store"}

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


class TransferEngineWeights:
    """vLLM's weight-transfer engine: one collective per refresh includes every member of the group, so
    all of them move to the published version together (one transfer in flight).

    The push runs as Ray calls on the trainer ranks (`push_weights_to_rollout`): `pending()` hands the
    controller those refs to wait on like any load, and the trainer actors run them in submission order.
    A push sends the trainer's weights as they are when it runs: one issued while a step is running
    (after a loss, or behind a push in flight) carries that step's newer version, and each instance is
    recorded at the version its report names, so the next push is not a repeat of it (a sender refuses
    to send one version twice over the same group).

    A process group cannot lose or take in a member, so instance recovery re-forms it: a lost instance
    leaves the membership and its replacement re-enters it when it is up (`lost` / `replaced`); the
    next push then goes over a new group (new key and port: trainer rank 0 tears the old one down, every
    member's worker leaves it) and carries the published version to every member, the replacement
    included. A push that breaks on a dead member is void: the survivors keep their weights, the dead
    one is handed to recovery (`ActorLost`, one line) and the push is repeated over the survivors at once.
    Every wait is bounded by `timeout_s` and names the peer; a dead trainer ends the run in one line.
    """

    def __init__(self, trainer: Any, instances: list[Any], drain: bool, kind: str = "cpu",
                 colocated: bool = False, timeout_s: float = 300.0) -> None:
        from asp_npu.weights.engine_link import TransferEngineLink

        self.trainer, self.instances = trainer, instances  # the fleet's list: a replacement lands in it
        self.held = [0] * len(instances)
        self.published = 0
        self.sync = TransferEngineLink(kind=kind, colocated=colocated, drain=drain, timeout_s=timeout_s)
        self.connect_s = self.sync.connect(instances, trainer)
        assert self.sync.link is not None
        self.workers = list(self.sync.link.workers)  # a replacement has its predecessor's settings
        self.out: set[int] = set()  # lost and not back yet: outside the group
        self.stale = False  # the membership changed: the next push re-forms the group
        self.regroups: list[dict[str, Any]] = []
        self._push: tuple[list[Any], int, float, list[int]] | None = None  # (refs, version, t0, members)

    def gather(self) -> Gathered:
        t = time.time()  # the trainer sends its weights itself when the refresh starts
        return Gathered(None, t, t)

    def publish(self, gathered: Gathered, version: int) -> None:
        self.published = version

    def members(self) -> list[int]:
        return [i for i in range(len(self.instances)) if i not in self.out]

    def refresh(self) -> None:
        members = self.members()
        if self._push is not None or not members or min(self.held[i] for i in members) >= self.published:
            return
        if self.stale:
            actors, workers = [self.instances[i] for i in members], [self.workers[i] for i in members]
            self.sync.regroup(actors, members, workers)
            self.stale = False
            self.regroups.append({"t": time.time(), "members": members, "version": self.published})
        link = self.sync.link
        assert link is not None
        refs = [a.call.remote("push_weights_to_rollout", link, True) for a in self.trainer.actors]
        self._push = (refs, self.published, time.time(), members)

    def pending(self) -> list[Any]:
        """The push calls still running (ranks other than 0 return right after the gather: handing
        those back would turn the controller's wait into a spin)."""
        import ray

        if self._push is None:
            return []
        refs = self._push[0]
        _, running = ray.wait(refs, num_returns=len(refs), timeout=0)
        return running or refs[:1]

    def poll(self) -> list[Refreshed]:
        import ray

        if self._push is None:
            return []
        refs, version, t0, members = self._push
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        if len(ready) < len(refs):
            return []
        self._push = None
        try:
            out = ray.get(refs)[0]
        except Exception as exc:  # noqa: BLE001 - sorted out by `_broken`
            self._broken(exc, members)
            self.refresh()  # the survivors get the published weights over a new group at once
            return []
        t_end = time.time()
        self.sync.history.append({**out, "backend": self.sync.backend, "total_s": t_end - t0})
        if out.get("formed") and self.regroups:
            self.regroups[-1]["connect_s"] = out["connect_s"]
        done = []
        for i, rep in zip(members, out["instances"], strict=True):  # in the order of the link's members
            if i in self.out:
                continue  # lost while the push ran: its load is void
            load = max(0.0, float(rep["total_s"]) - float(rep["drain_s"]))
            sent = int(rep["version"])  # the trainer's version when the push ran (>= `version`)
            done.append(Refreshed(i, sent, t_end, load, {**rep, "send_s": out.get("send_s", 0.0)}))
            self.held[i] = sent
        self.refresh()  # a replacement that came up meanwhile is still behind
        return done

    def _broken(self, exc: BaseException, members: list[int]) -> None:
        """A push failed: the group is void. A dead trainer or a failure no lost member explains ends the
        run (one line); members found dead leave the group and go to recovery (`ActorLost`). A member
        already lost while the push ran explains it too: its slot may by now hold a live replacement."""
        import ray

        from asp_npu.remote import ActorLost
        from asp_npu.weights.engine_link import WeightSyncError

        self.stale = True
        if isinstance(exc, ray.exceptions.RayActorError):
            raise WeightSyncError(f"weight_refresh failed: the trainer (weight-group rank 0) is gone "
                                  f"({type(exc).__name__})") from None
        lost = [members[k] for k in _dead([self.instances[i] for i in members])]
        if not lost and not self.out & set(members):  # a member found lost while the push ran explains it
            raise WeightSyncError(self.sync._diagnose("send", exc)) from None
        new = [i for i in lost if i not in self.out]
        self.out.update(lost)
        if new:
            raise ActorLost(f"rollout instance {new[0]}", f"rollout instance {new[0]} died during a weight "
                            f"push ({len(new)} member(s) of the weight group lost)")

    def lost(self, instance: int) -> None:
        """Its actor died: it leaves the group (a push in flight fails or completes without it); survivors
        still behind (a push that broke on it) get the published weights over a new group."""
        if instance not in self.out:
            self.out.add(instance)
            self.stale = True
        self.refresh()

    def replaced(self, instance: int) -> None:
        """Its replacement is up (holding the initial weights): a member again from the next push."""
        self.out.discard(instance)
        self.held[instance] = 0
        self.stale = True

    def has_published(self) -> bool:
        return self.published > 0

    def describe(self) -> dict[str, Any]:
        return {"path": "transfer-engine", "backend": self.sync.backend, "connect_s": self.connect_s,
                "regroups": self.regroups}

    def close(self) -> None:
        self.sync.close()


def _dead(actors: list[Any], timeout: float = 10.0) -> list[int]:
    """Which of `actors` are gone (a ping answered by RayActorError; all pinged at once, bounded)."""
    import ray

    refs = [a.ping.remote() for a in actors]
    ray.wait(refs, num_returns=len(refs), timeout=timeout)
    out = []
    for k, ref in enumerate(refs):
        try:
            ray.get(ref, timeout=0)
        except ray.exceptions.RayActorError:
            out.append(k)
        except Exception:  # noqa: BLE001 - silent or busy is not dead (the fleet's health check decides)
            pass
    return out


def make_weights(transfer: str, trainer: Any, instances: list[Any], dtype: str, drain: bool,
                 kind: str = "cpu", colocated: bool = False) -> WeightSync:
    """The transport `generate_config.weight_transfer` names (`auto` = vLLM's weight-transfer engine)."""
    if transfer == "object-store":
        return ObjectStoreWeights(trainer, instances, dtype, drain)
    return TransferEngineWeights(trainer, instances, drain, kind, colocated)


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
