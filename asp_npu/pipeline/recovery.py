"""Rollout instance failures on the Ray side: detect, re-dispatch, restart, rejoin.

Each turn of the control loop `check()` looks for failed requests (reported by the instances to the
queue actor), dead instances (a ping to a gone actor, or one unanswered; `Fleet.dead`) and hung ones
(work held, nothing delivered for `rl_config.instance_timeout_s`; `core.recovery.Watchdog`). A lost
instance's undelivered groups are cancelled in the TrainQueue and re-dispatched to the live instances
(`DispatchPolicy.lost` / `redispatch`: each exactly once); a fresh actor replaces it on the same
devices, gets every prompt and the current weights (on the transfer-engine path through a re-formed
weight group, `weights.TransferEngineWeights`), then takes work again. A failed request is
generated again up to `rl_config.max_request_retries` times (`core.recovery.Retries`), then the run
stops with one line naming the prompt. Every failure and recovery goes to `run_log.jsonl` at once and
into the summary (`failures`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from asp_npu.config import Config
from asp_npu.core.policy import DispatchPolicy
from asp_npu.core.recovery import Retries, Watchdog
from asp_npu.errors import UserError
from asp_npu.remote import ActorLost
from asp_npu.weights.refresh import Refreshed, WeightSync

if TYPE_CHECKING:
    from asp_npu.pipeline.fleet import Fleet
    from asp_npu.pipeline.recorder import Recorder


class Supervisor:
    """Watches the fleet for the controller: it acts on the fleet, the dispatch policy and the weight
    seam (`attach`ed once the fleet is up) and writes what happened to the recorder."""

    def __init__(self, cfg: Config, fleet: Fleet, policy: DispatchPolicy, recorder: Recorder) -> None:
        rl = cfg.rl_config
        self.fleet, self.policy, self.recorder = fleet, policy, recorder
        self.stall_timeout_s = cfg.trainer.stall_timeout_s
        self._weights: WeightSync | None = None
        self.retries = Retries(rl.max_request_retries)
        self.watchdog = Watchdog(fleet.shape.instances, rl.instance_timeout_s)
        self.rejoining: dict[int, float] = {}  # instance -> when it was found lost
        self.recoveries: list[dict[str, Any]] = []
        self.lost_count = 0

    def attach(self, weights: WeightSync) -> None:
        """The weight seam, made once the fleet's actors are up."""
        self._weights = weights

    @property
    def weights(self) -> WeightSync:
        if self._weights is None:
            raise RuntimeError("Supervisor: no weight seam attached (the fleet is not started)")
        return self._weights

    def failed(self, failures: list[tuple[str, int, str]]) -> None:
        """Requests that failed: generate them again, or stop after `max_retries`."""
        for gid, inst, err in failures:
            if not self.fleet.cancel([gid]):
                continue  # the group arrived or its instance was lost meanwhile
            if not self.retries.failed(gid, err):
                self.recorder.event("request_given_up", group=gid, instance=inst, error=err)
                n, k = self.retries.failures[gid], self.retries.max_retries
                raise UserError(f"prompt '{gid}' failed {n} times on the rollout instances "
                                f"(rl_config.max_request_retries={k}): {err}")
            self.recorder.event("request_retry", group=gid, instance=inst, error=err,
                             attempt=self.retries.failures[gid])
            self.policy.redispatch([gid])

    def check(self) -> None:
        """Find dead or hung instances and lose them; let restarted ones rejoin."""
        now = time.time()
        busy = self.policy.busy()
        for i in range(len(busy)):
            if not busy[i] or i in self.policy.down:
                self.watchdog.progressed(i, now)
        lost = self.fleet.dead(self.policy.down)
        lost += [(i, f"delivered nothing for {self.watchdog.timeout_s:.0f}s with work")
                 for i in self.watchdog.hung(busy, now) if i not in self.policy.down]
        for i, cause in lost:
            self.lose(i, cause)
        for i in self.fleet.started():
            self._loaded(i)
        w = self.weights
        for i in [i for i in self.rejoining if i not in self.fleet.starting and w.held[i] >= 0]:
            self._rejoin(i)  # its load finished in a poll that another lost instance interrupted

    def arrived(self, instance: int, t: float) -> None:
        self.watchdog.progressed(instance, t)

    def lose(self, i: int, cause: str) -> None:
        """Take instance i out, re-dispatch its undelivered groups, start its replacement."""
        now = time.time()
        if i in self.policy.down:
            return
        self.weights.lost(i)  # a load in flight on the lost actor is void; it leaves the weight group
        missing = self.policy.lost(i)
        again = self.fleet.cancel(missing)
        self.policy.redispatch(again)
        self.fleet.restart(i)
        self.lost_count += 1
        self.rejoining[i] = now
        self.recorder.event("instance_lost", instance=i, cause=cause, groups_redispatched=len(again))
        print(f"asp-npu: rollout instance {i} lost ({cause}); {len(again)} group(s) re-dispatched, "
              "restarting it", flush=True)

    def _loaded(self, i: int) -> None:
        """Instance i's replacement is up: load the newest weights (it rejoins when they are in; on the
        transfer-engine path the weight group is re-formed with it first)."""
        w = self.weights
        self.recorder.event("instance_restarted", instance=i, restart_s=time.time() - self.rejoining[i])
        w.replaced(i)
        if not w.has_published():  # it holds the initial weights
            self._rejoin(i)
            return
        w.held[i] = -1
        w.refresh()

    def refreshed(self, r: Refreshed) -> None:
        """A replacement rejoins with the first weights it loads (admission holds it to the lag bound
        at the version it holds, like any instance behind the newest weights)."""
        if r.instance in self.rejoining:
            self._rejoin(r.instance)

    def _rejoin(self, i: int) -> None:
        t_lost = self.rejoining.pop(i)
        self.policy.back(i)
        self.watchdog.progressed(i, time.time())
        rec = self.recorder.event("instance_recovered", instance=i, recovery_s=time.time() - t_lost)
        self.recoveries.append(rec)
        print(f"asp-npu: rollout instance {i} back after {rec['recovery_s']:.1f}s", flush=True)

    def poll_refreshes(self) -> list[Refreshed]:
        """Finished weight loads; a load on an actor that died loses that instance."""
        while True:
            try:
                return self.weights.poll()
            except ActorLost as exc:
                self.lose(int(exc.who.rsplit(" ", 1)[-1]), "actor died (weight load)")

    def settle(self, timeout: float = 600.0) -> None:
        """At the end of the run, wait (bounded) for replacements still starting to rejoin, so the fleet
        is whole again and every recovery is measured."""
        deadline = time.time() + timeout
        while self.rejoining and time.time() < deadline:
            self.check()
            for r in self.poll_refreshes():
                self.recorder.refreshed(r)
                self.refreshed(r)
            time.sleep(0.2)

    def progress_guard(self, last_progress: float) -> None:
        """Stop with one line when the whole pipeline made no progress for `trainer.stall_timeout_s`."""
        timeout = self.stall_timeout_s
        if time.time() - last_progress > timeout:
            errors = [e["error"] for s in self.fleet.stats() for e in s["errors"]]
            queue = self.fleet.queue_state()
            raise UserError(f"pipeline made no progress for {timeout:.0f}s (queue {queue}); "
                            f"instance errors: {errors[:3] or 'none'}")

    def summary(self) -> dict[str, Any]:
        rec = [r["recovery_s"] for r in self.recoveries]
        return {"instances_lost": self.lost_count, "recoveries": self.recoveries,
                "recovery_s_max": max(rec, default=0.0), "still_restarting": sorted(self.rejoining),
                "requests_retried": self.retries.retried,
                "requests_given_up": len(self.retries.given_up)}
