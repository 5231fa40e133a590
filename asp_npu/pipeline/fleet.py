"""The fleet: the actors of one run -- where they go, starting them, talking to them, closing them.

Placement first (no Ray needed): how many instances the mode gets on this node's devices and, on CPU,
which cores each instance and the trainer ranks get (`device.node_placement`). Then `start()`: Ray, the
TrainQueue actor, the rollout instances (engines built in parallel, warmed up off the clock) and the
trainer group. Everything else the controller asks the actors goes through the small methods here.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from asp_npu.config import Config
from asp_npu.core.modes import Mode
from asp_npu.core.records import Arrival, Minibatch, Unit
from asp_npu.core.shape import RunShape
from asp_npu.core.staleness import token_lag_bound
from asp_npu.data.shaping import dapo_shaping
from asp_npu.device import spec
from asp_npu.observe.actor_log import SETUP_HOOK, DriverRayLog, log_path, with_log
from asp_npu.pipeline.derived import RunDerived
from asp_npu.pipeline.placement import ClusterPlacement
from asp_npu.remote import CALL_S, ActorFailure, ActorLost, ActorTimeout, get, kill_quietly
from asp_npu.rollout.instance import START_S
from asp_npu.types import PromptItem

WARMUP_S = 120.0
QUEUE = "the TrainQueue actor"
PING_S = 1.0  # an instance is pinged at most this often (health check)
PAUSE_S = 600.0 + CALL_S  # a pause drains running sequences (`vllm_engine.DRAIN_S`), then answers


class Fleet:
    def __init__(self, cfg: Config, kind: str, mode: Mode, derived: RunDerived | None = None) -> None:
        """Place the run: `self.derived` is `derived` (default: nothing derived yet) with the trainer
        ranks' cores and threads the placement gives; `cfg` is only read."""
        from asp_npu.device import available_devices

        self.cfg, self.kind, self.mode = cfg, kind, mode
        self.derived = derived or RunDerived.at_start(cfg)
        per_node = cfg.trainer.n_devices_per_node or available_devices(kind)  # type: ignore[arg-type]
        self.shape = RunShape.from_config(cfg, per_node * max(1, cfg.trainer.nnodes), mode)
        self.placement = self._place(per_node)
        self.cluster = ClusterPlacement(cfg, kind, self.shape, self._layout_devices(per_node))
        self.trainer: Any = None
        self.critic: Any = None  # PPO's value model (rl_config.adv_estimator gae): pipeline/ppo.py
        self.ppo: Any = None
        self.instances: list[Any] = []
        self._unstarted: list[Any] = []  # instances whose engines are still building (`start`)
        self.queue: Any = None
        self._owns_ray = False
        self._ray_log: DriverRayLog | None = None
        self._arrivals_ref: Any = None  # the pending `wait_arrivals` call
        self._wakes = 0
        self.failures_seen = 0  # failed requests already handed to the driver
        self.items: list[PromptItem] = []  # every prompt given out (a restarted instance gets them all)
        self._launch: Any = None  # (settings, sampling) the instances were built with
        self._pings: dict[int, tuple[Any, float]] = {}  # instance -> (pending ping, sent at)
        self.starting: dict[int, tuple[Any, float]] = {}  # restarting instance -> (its start call, since)

    def _place(self, per_node: int) -> Any:
        """An asynchronous mode whose instances and trainer fit in the cores gets disjoint, pinned cores
        (the CPU form of a disaggregated cluster); otherwise the cores are shared. The trainer ranks get
        the placement's cores unless actor_config.cpu_cores / num_threads say otherwise (recorded in
        `self.derived`). None on accelerators."""
        from asp_npu.device import node_placement

        act, sh = self.cfg.actor_config, self.shape
        placement = node_placement(self.kind, per_node, sh.instances, sh.infer_tp, sh.trainer_world,  # type: ignore[arg-type]
                                   self.mode.colocated)
        if placement is None:
            return None
        cores, threads = self.derived.trainer_cores, self.derived.trainer_threads
        if not act.cpu_cores and placement.disjoint:
            cores = tuple(placement.trainer_cores)
        if not act.num_threads:  # a shared asynchronous trainer gets the cores the instances leave
            busy = 0 if placement.disjoint or self.mode.colocated else sh.instances * sh.infer_tp
            free = len(placement.trainer_cores) - busy
            threads = max(1, free // sh.trainer_world)
        self.derived = self.derived.placed(cores, threads)
        return placement

    def _layout_devices(self, per_node: int) -> int:
        """Devices per node the layout places on: on CPU the cores are shared (a core is a logical
        device for Ray), so a layout that needs more than the cores gets as many as it needs."""
        sh = self.shape
        if not spec(self.kind).shared_cores:  # type: ignore[arg-type]
            return per_node
        rollout = sh.instances * sh.infer_tp
        need = max(rollout, sh.trainer_world) if self.mode.colocated else rollout + sh.trainer_world
        return max(per_node, -(-need // max(1, self.cfg.trainer.nnodes)))

    def placement_summary(self) -> dict[str, Any] | None:
        p = self.placement
        if p is None:
            return None
        return {"disjoint": p.disjoint, "instance_cores": [list(c) for c in p.instance_cores],
                "trainer_cores": list(self.derived.trainer_cores) or list(p.trainer_cores)}

    def start(self, warmup: PromptItem) -> None:
        """Ray, the queue actor, the instances and the trainer group: the engines build (in parallel)
        while the trainer ranks form, as on a cluster where each has its own devices."""
        from asp_npu.device import init_ray
        from asp_npu.pipeline.queue_actor import make_queue_actor
        from asp_npu.rollout.instance import launch_instances, wait_started
        from asp_npu.trainer.group import TrainerGroup

        sh, gen = self.shape, self.cfg.generate_config
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        os.environ.setdefault("RAY_DEDUP_LOGS", "1")
        tr = self.cfg.trainer
        self._ray_log = DriverRayLog(log_path(tr.run_dir, "ray-driver"))
        if init_ray(sh.instances * sh.infer_tp + sh.trainer_world + 1, tr.nnodes <= 1, tr.ray_address,
                    log_to_driver=False, configure_logging=False,  # actors write to logs/ (`actor_log`)
                    runtime_env={"worker_process_setup_hook": SETUP_HOOK}):
            self._owns_ray = True
        self._ray_log.attach()  # Ray cleared the "ray" logger's handlers while starting
        rl = self.cfg.rl_config
        self.queue = make_queue_actor(sh.minibatch_groups, sh.version_groups, sh.max_lag, sh.group_size,
                                      self.mode.queue_order, sh.steps_per_version,
                                      token_lag_bound(rl.partial_rollout, rl.max_token_lag, sh.max_lag),
                                      dapo_shaping(self.cfg, sh.window, sh.iterations))
        self.cluster.create()
        settings, sampling = self._launch = self._engine_settings()
        self._unstarted = launch_instances(sh.instances, settings, sampling, kind=self.kind,
                                           kv_cache_gib=gen.kv_cache_gib, devices_per_instance=sh.infer_tp,
                                           sink=self.queue, admission=self.mode.admission, keep_polled=False,
                                           placement=self.placement, options_for=self._instance_options,
                                           start=False)
        starting = [a.start.remote() for a in self._unstarted]  # the engines build while the trainer forms
        start = self.derived.rank_start()
        self.trainer = TrainerGroup(self.cfg, placement=self._trainer_options, start=start)
        if self.cfg.rl_config.adv_estimator == "gae":
            self._start_critic()
        wait_started(self._unstarted, starting)
        self.instances, self._unstarted = self._unstarted, []
        self._warm_up(warmup)

    def _start_critic(self) -> None:
        """PPO's critic ranks, colocated with the trainer ranks (their bundles and cores, no CPU of
        their own in Ray's count); on accelerators a critic on its own devices is not built yet."""
        from asp_npu.errors import UserError
        from asp_npu.pipeline.ppo import PPOStep
        from asp_npu.trainer.group import TrainerGroup

        if not spec(self.kind).shared_cores:  # type: ignore[arg-type]
            raise UserError(f"rl_config.adv_estimator: gae runs its critic colocated with the trainer on "
                            f"CPU only; not on '{self.kind}' yet")
        self.critic = TrainerGroup(self.cfg, cpus_per_rank=0, placement=self._critic_options, role="critic",
                                   start=self.derived.rank_start())
        self.ppo = PPOStep(self.cfg, self.trainer, self.critic)

    def _critic_options(self, rank: int, options: dict[str, Any]) -> dict[str, Any]:
        """Critic rank's actor options: the bundle of trainer rank `rank mod trainer ranks`, its output to
        logs/critic-rank<r>.log."""
        out = {**options, **self.cluster.trainer_options(rank % self.shape.trainer_world)}
        return with_log(out, log_path(self.cfg.trainer.run_dir, f"critic-rank{rank}"))

    def train_step(self, batch: Any) -> dict[str, float]:
        """One trainer step: the policy's (GRPO-style estimators), or PPO's policy and critic."""
        return self.ppo.step(batch) if self.ppo is not None else self.trainer.train_step(batch)

    def _instance_options(self, i: int, options: dict[str, Any]) -> dict[str, Any]:
        """Instance i's actor options in its placement group, its output to logs/instance-i.log."""
        out = self.cluster.instance_options(i, options)
        return with_log(out, log_path(self.cfg.trainer.run_dir, f"instance-{i}"))

    def _trainer_options(self, rank: int, options: dict[str, Any]) -> dict[str, Any]:
        """Trainer rank's actor options in its TP group's bundle, its output to logs/trainer-rank<r>.log."""
        out = {**options, **self.cluster.trainer_options(rank)}
        return with_log(out, log_path(self.cfg.trainer.run_dir, f"trainer-rank{rank}"))

    def _engine_settings(self) -> tuple[Any, Any]:
        from asp_npu.data.rewards import reward_spec
        from asp_npu.rollout.engine import EngineSettings, SamplingSettings
        from asp_npu.rollout.multi_turn import multi_turn_spec

        cfg, gen = self.cfg, self.cfg.generate_config
        sc = gen.sampling_config
        max_len = gen.max_model_len or (cfg.rl_config.max_prompt_length + sc.max_tokens)
        settings = EngineSettings(
            model_path=self.derived.policy_path, dtype=cfg.model.dtype, max_num_seqs=gen.max_num_seqs,
            max_num_batched_tokens=gen.max_num_batched_tokens, max_model_len=max_len,
            enforce_eager=gen.enforce_eager, gpu_memory_utilization=gen.gpu_memory_utilization,
            seed=cfg.data.seed, enable_prefix_caching=self.drain, reward=reward_spec(cfg.reward),
            multi_turn=multi_turn_spec(cfg.multi_turn))
        sampling = SamplingSettings(n=self.shape.group_size, temperature=sc.temperature, top_p=sc.top_p,
                                    top_k=sc.top_k, min_p=sc.min_p, max_tokens=sc.max_tokens,
                                    seed=cfg.data.seed,
                                    greedy_baseline=cfg.rl_config.adv_estimator == "remax")
        return settings, sampling

    @property
    def drain(self) -> bool:
        """Refresh by draining: a colocated trainer refreshes idle engines; in flight only matters while
        sequences run."""
        return self.mode.colocated or self.cfg.rl_config.weight_refresh_mode == "drain"

    def _warm_up(self, base: PromptItem) -> None:
        """One short generation per instance before the clock starts: the first generate of a vLLM
        process pays a one-off warm-up (seconds on CPU) that would otherwise land on iteration 1."""
        from asp_npu.pipeline.queue_actor import WARMUP_PREFIX

        refs = []
        n = min(self.shape.group_size, self.shape.slots)
        for i, inst in enumerate(self.instances):
            item = PromptItem(f"{WARMUP_PREFIX}{i}@0", base.prompt_token_ids, base.text, base.ground_truth,
                              {**base.meta, "epoch": 0})
            get(inst.add_prompts.remote([item]), CALL_S, self.name(i), "warm-up prompt")
            unit = _wire(Unit(-1 - i, -1, (item.prompt_id,), n))
            get(inst.submit_units.remote([unit]), CALL_S, self.name(i), "warm-up unit")
            refs.append(inst.wait_idle.remote(WARMUP_S))
        get(refs, WARMUP_S + CALL_S, self.names(), "warm-up")

    # ---------------------------------------------------------------- the actors, as the loop needs them
    def name(self, i: int) -> str:
        return f"rollout instance {i}"

    def names(self) -> list[str]:
        return [self.name(i) for i in range(len(self.instances))]

    def add_prompts(self, items: list[PromptItem]) -> None:
        """Give `items` to every instance whose actor is up -- one held out while it loads weights after a
        restart included, since it rejoins with units of these prompts (a restarting one gets them all
        when it is up)."""
        self.items += items
        live = [i for i in range(len(self.instances)) if i not in self.starting]
        refs = [(i, self.instances[i].add_prompts.remote(items)) for i in live]
        for i, ref in refs:
            try:
                get(ref, CALL_S, self.name(i), "add_prompts")
            except ActorLost:
                pass  # the health check finds it; its replacement gets every prompt

    def submit(self, i: int, unit: Unit) -> None:
        self.instances[i].submit_units.remote([_wire(unit)])

    def admit(self, unit: Unit, version: int, instance: int = -1) -> bool:
        ref = self.queue.admit.remote(list(unit.groups), version, instance)
        return bool(get(ref, CALL_S, QUEUE, "admit"))

    def cancel(self, groups: list[Any]) -> list[Any]:
        """Free the ledger places of groups that will not arrive; returns those still in flight."""
        return get(self.queue.cancel.remote([str(g) for g in groups]), CALL_S, QUEUE, "cancel")

    # ---------------------------------------------------------------- failures: detect, restart
    def dead(self, skip: set[int]) -> list[tuple[int, str]]:
        """Instances (not in `skip`) whose actor died or stopped answering: a ping per instance at most
        every `PING_S`, read without blocking; one unanswered for `CALL_S` is dead too."""
        import ray
        from ray.exceptions import RayActorError

        now, out = time.time(), []
        for i, inst in enumerate(self.instances):
            if i in skip or i in self.starting:
                continue
            ref, sent = self._pings.get(i, (None, 0.0))
            if ref is None:
                if now - sent >= PING_S:
                    self._pings[i] = (inst.ping.remote(), now)
                continue
            if not ray.wait([ref], timeout=0)[0]:
                if now - sent > CALL_S:
                    out.append((i, f"no answer to a ping for {now - sent:.0f}s"))
                continue
            try:
                ray.get(ref, timeout=0)
                self._pings[i] = (None, now)
            except RayActorError as exc:
                out.append((i, f"actor died ({type(exc).__name__})"))
        for i, _ in out:
            self._pings.pop(i, None)
        return out

    def restart(self, i: int) -> None:
        """Replace instance i by a fresh actor (same devices and settings); its engine builds in the
        background (`started` says when it is up)."""
        import ray

        from asp_npu.device import PIN_CORES_ENV, ROLLOUT_NICE_ENV, available_devices
        from asp_npu.rollout.instance import RolloutInstance, instance_placement

        kill_quietly(self.instances[i])
        p, sh, gen = self.placement, self.shape, self.cfg.generate_config
        cores = p.instance_cores[i] if p is not None else None
        per_node = self.cfg.trainer.n_devices_per_node or available_devices(self.kind)  # type: ignore[arg-type]
        env, options = instance_placement(self.kind, i, sh.infer_tp, per_node, gen.kv_cache_gib, cores)
        if p is not None and p.rollout_nice:
            env = {**env, ROLLOUT_NICE_ENV: str(p.rollout_nice)}
        if p is not None and p.disjoint:
            env = {**env, PIN_CORES_ENV: ",".join(str(c) for c in p.instance_cores[i])}
        settings, sampling = self._launch
        self.cluster.rehome(i)  # its node may be the reason it died
        options = self._instance_options(i, options)
        actor = ray.remote(RolloutInstance).options(**options).remote(
            i, settings, sampling, env, self.queue, self.mode.admission, False)
        self.instances[i] = actor  # in place: the weights seam holds this same list
        self.starting[i] = (actor.start.remote(), time.time())

    def started(self) -> list[int]:
        """Restarted instances whose engine is up and that hold every prompt; a failed start raises."""
        import ray

        up = []
        for i, (ref, since) in list(self.starting.items()):
            if not ray.wait([ref], timeout=0)[0]:
                if time.time() - since > START_S:
                    raise ActorTimeout(self.name(i), f"{self.name(i)}: restart not up within {START_S:.0f}s")
                continue
            get(ref, CALL_S, self.name(i), "restart")
            get(self.instances[i].add_prompts.remote(self.items), CALL_S, self.name(i), "add_prompts")
            del self.starting[i]
            up.append(i)
        return up

    def take_batch(self, timeout: float) -> Minibatch | None:
        return get(self.queue.get_batch.remote(timeout), timeout + CALL_S, QUEUE, "get_batch")

    def next_arrivals(self, since: int, timeout: float, also: list[Any]
                      ) -> tuple[list[Arrival], list[tuple[str, int, str]]]:
        """Arrivals after index `since`: blocks until one comes, the trainer wakes the queue, one of
        `also` (weight loads) is ready, or `timeout`; also the requests that failed since the last call.
        One wait is kept pending across calls."""
        import ray

        if self._arrivals_ref is None:
            q = self.queue
            self._arrivals_ref = q.wait_arrivals.remote(since, timeout, self._wakes, self.failures_seen)
        ready, _ = ray.wait([self._arrivals_ref, *also], num_returns=1, timeout=timeout)
        if self._arrivals_ref not in ready:
            return [], []
        rows, self._wakes, failures = get(self._arrivals_ref, CALL_S, QUEUE, "wait_arrivals")
        self._arrivals_ref = None
        self.failures_seen += len(failures)
        return rows, failures

    def wake(self) -> None:
        self.queue.wake.remote()

    def pause(self) -> None:
        get([a.pause.remote() for a in self.instances], PAUSE_S, self.names(), "pause")

    def resume(self) -> None:
        get([a.resume.remote() for a in self.instances], CALL_S, self.names(), "resume")

    def stats(self) -> list[dict[str, Any]]:
        """Every instance's accounting; one that is gone or restarting reports nothing."""
        out = []
        for i, a in enumerate(self.instances):
            try:
                out.append(get(a.stats.remote(), CALL_S, self.name(i), "stats"))
            except ActorFailure:
                out.append({"instance": i, "sequence_events": [], "unit_events": [], "busy_intervals": [],
                            "errors": [], "groups_delivered": 0, "tokens_generated": 0})
        return out

    def series(self) -> dict[str, Any]:
        return get(self.queue.series.remote(), CALL_S, QUEUE, "series")

    def queue_state(self) -> dict[str, Any]:
        return get(self.queue.state.remote(), CALL_S, QUEUE, "state")

    def close(self) -> None:
        """Never hangs, never raises: each part gets a bounded, best-effort shutdown, then is killed;
        the queue actor and Ray always go down."""
        ray = sys.modules.get("ray")  # None: Ray never imported, or its import cut short by a signal
        try:
            for a in self._unstarted:  # busy building its engine, it would answer a shutdown only once built
                kill_quietly(a)
            self._unstarted = []
            if self.instances:
                try:
                    get([a.shutdown.remote() for a in self.instances], CALL_S, self.names(), "shutdown")
                except Exception:  # noqa: BLE001 - best effort; the actors are killed below anyway
                    pass
                for a in self.instances:
                    kill_quietly(a)
                self.instances = []
            for group in (self.critic, self.trainer):
                if group is not None:
                    group.shutdown()
            self.trainer = self.critic = self.ppo = None
        finally:
            if self.queue is not None:
                kill_quietly(self.queue)
                self.queue = None
            if ray is not None and ray.is_initialized():
                self.cluster.remove()  # a joined cluster outlives the run: give its devices back
            if self._owns_ray and ray is not None and ray.is_initialized():
                ray.shutdown()
            if self._ray_log is not None:
                self._ray_log.restore()
                self._ray_log = None


def _wire(unit: Unit) -> Any:
    """A unit as the rollout instance takes it (`rollout.instance.UnitSpec`)."""
    from asp_npu.rollout.instance import UnitSpec

    return UnitSpec(unit.uid, tuple((str(g), k) for g, k in unit.samples))

