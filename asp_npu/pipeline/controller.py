"""The pipeline controller: plans windows, drives the rollout instances, feeds the trainer, refreshes weights.

One process (the driver) owns the control loop; the engines, the trainer ranks and the TrainQueue are
Ray actors. Per planning window (one global batch of `rl_config.global_batch_size` prompts = one
iteration, MindSpeed-RL style), the length predictor estimates every group, the offline planner (or
FIFO for the baselines) cuts the window into units, and the loop then:

1. dispatches units to instances (`submit_units`) as far ahead as the mode allows, each unit admitted
   whole by the TrainQueue at the weights version its instance holds (bounded lag: prevent, never
   discard); a withheld unit marks its instance `blocked`;
2. polls arrivals of finished groups (the instances stream them straight into the queue actor) and
   feeds every finished sample's length to the predictor;
3. when the trainer is free, takes a complete minibatch from the queue and runs the step in a worker
   thread (so dispatching goes on meanwhile);
4. after a step (every k steps / once per window, per mode) gathers the new HF weights once and sends
   them to each instance, which loads them between two engine steps while its sequences keep
   decoding (`rl_config.weight_refresh_mode=inflight`; `drain` finishes running sequences on the old
   weights first); no global stop either way.

`mindspeed-sync` alternates instead (generate the whole window, pause engines, train every step,
resume + refresh). Everything the run produced goes to the run directory (see `run_dir.py`).
"""

from __future__ import annotations

import copy
import os
import random
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from asp_npu.config import Config
from asp_npu.core import run_dir as rd
from asp_npu.core.modes import Mode as ModeSpec
from asp_npu.core.modes import mode_spec
from asp_npu.core.shape import RunShape
from asp_npu.errors import UserError
from asp_npu.observe import metrics as M
from asp_npu.pipeline.modes import instance_count
from asp_npu.pipeline.preflight import window_prompts
from asp_npu.pipeline.real_events import InstanceRecord, TrainerRecord, build_event_log
from asp_npu.schedule.dispatch import StreamDispatcher
from asp_npu.types import PromptItem, TrainBatch, Trajectory

POLL_S = 0.01  # refresh polling while every instance is brought to new weights (short, rare)
WAIT_S = 1.0  # longest block between events; the loop wakes at once on arrivals, refreshes, trainer steps


@dataclass
class PlannedUnit:
    """One dispatch unit of a window, with the global id the instance reports it under."""

    uid: int
    window: int
    instance: int  # planned instance (static dispatch) or -1
    groups: list[str]  # instance-level prompt ids (`<prompt_id>@<epoch>`)
    samples: list[tuple[str, int]]
    predicted_tokens: float
    done_groups: int = 0
    submitted_to: int = -1
    t_submit: float = 0.0


@dataclass
class Window:
    index: int
    items: list[PromptItem]  # instance-level prompts (ids `<prompt_id>@<epoch>`, meta epoch/base id)
    units: list[PlannedUnit] = field(default_factory=list)
    plan_summary: dict[str, Any] = field(default_factory=dict)


def group_id(prompt_id: str, epoch: int) -> str:
    return f"{prompt_id}@{epoch}"


def window_stream(prompts: list[PromptItem], window: int, seed: int) -> Callable[[int], list[PromptItem]]:
    """Window w's prompts: epochs are seeded permutations of the dataset, cut into consecutive windows.

    Each returned item is a copy whose id is unique in the run (`<id>@<epoch>`), so the same prompt
    in two epochs is two groups; `meta["base_id"]`/`meta["epoch"]` keep what the predictor needs.
    """
    n = len(prompts)
    cache: dict[int, list[int]] = {}

    def order(epoch: int) -> list[int]:
        if epoch not in cache:
            idx = list(range(n))
            random.Random(seed * 1_000_003 + epoch).shuffle(idx)
            cache[epoch] = idx
        return cache[epoch]

    def get(w: int) -> list[PromptItem]:
        out = []
        for pos in range(w * window, (w + 1) * window):
            epoch, k = divmod(pos, n)
            base = prompts[order(epoch)[k]]
            meta = {**base.meta, "epoch": epoch, "base_id": base.prompt_id}
            out.append(PromptItem(group_id(base.prompt_id, epoch), base.prompt_token_ids, base.text,
                                  base.ground_truth, meta))
        return out

    return get


class Controller:
    """Owns the actors of one run; `run()` trains `trainer.train_iters` iterations and returns the summary."""

    def __init__(self, cfg: Config, run: rd.RunDir, prompts: list[PromptItem], kind: str = "cpu",
                 console: bool = True, label: str = "") -> None:
        cfg = copy.deepcopy(cfg)
        rl = cfg.rl_config
        self.cfg, self.run_dir, self.kind, self.label = cfg, run, kind, label
        self.spec: ModeSpec = mode_spec(rl.mode, cfg.generate_config.admission)
        self.placement = self._place()
        self.G = rl.n_samples_per_prompt
        self.M = rl.mini_batch_size
        self.mb_groups = self.M // self.G
        self.W = window_prompts(cfg)
        self.steps_per_window = self.W * self.G // self.M
        self.total_steps = cfg.trainer.train_iters * self.steps_per_window
        shape = RunShape.from_config(cfg, mode=self.spec)
        self.k, self.max_lag = shape.steps_per_version, shape.max_lag
        # a colocated trainer refreshes idle engines; in flight only matters while sequences run
        self.drain = self.spec.colocated or rl.weight_refresh_mode == "drain"
        self.slots = cfg.generate_config.max_num_seqs
        self.prompts = prompts
        self.windows: dict[int, Window] = {}
        self.next_window = 0
        self.n_windows = cfg.trainer.train_iters
        self._window_items = window_stream(prompts, self.W, cfg.data.seed)
        self.units: dict[int, PlannedUnit] = {}
        self.group_unit: dict[str, int] = {}
        self.pending: list[deque[int]] = [deque() for _ in range(self.K)]  # static dispatch
        self.pull: deque[int] = deque()  # pull and stream dispatch
        self.dispatcher = StreamDispatcher(self.K, slice_groups=self.mb_groups * self.k)  # stream dispatch
        self.inflight_units: list[set[int]] = [set() for _ in range(self.K)]
        self.inst_version = [0] * self.K
        self.refreshing: list[Any] = [None] * self.K
        self.refresh_started = [0.0] * self.K
        self.refresh_reports: list[dict[str, Any]] = []
        self.inst_records = [InstanceRecord() for _ in range(self.K)]
        self.trainer_record = TrainerRecord()
        self.version = 0  # trainer weights version (= optimizer steps done)
        self.base = 0  # step a resumed run continues after (`actor_config.load`); the ledger counts from it
        self.blob_ref: Any = None
        self.blob_version = 0
        self.arrivals_seen = 0
        self._arrivals_ref: Any = None  # the controller's pending `wait_arrivals` call
        self._wakes = 0
        self.step = 0
        self.samples_rows: list[dict[str, Any]] = []
        self.versions: list[tuple[float, int]] = []
        self.iterations: list[float] = []
        self.step_ends: list[float] = []
        self.train_step_s = 0.0
        self.trainer: Any = None
        self.instances: list[Any] = []
        self.queue: Any = None
        self._owns_ray = False
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asp-trainer")
        self.console = console
        self.metrics = M.MetricsLogger(run.path, cfg.trainer.logger if console else
                                       [x for x in cfg.trainer.logger if x != "console"],
                                       total_steps=self.total_steps, max_lag=self.max_lag,
                                       prefix=f"[{label}] " if label else "")
        self._tokenizer: Any = None
        self.predictor = self._make_predictor()
        self.t_start = 0.0
        self.tokens_arrived = 0
        self._last_step_end = 0.0
        self._arrived_tokens_since = 0
        self._pending_row: dict[str, Any] = {}
        self._lent_since: float | None = None
        self.auto_plan = not self.spec.colocated  # async modes plan the next window when work runs dry

    # ------------------------------------------------------------------ lifecycle
    def _place(self) -> Any:
        """Instances and CPU placement (`device.cpu_placement`): an asynchronous mode whose instances and
        trainer fit in the cores gets disjoint, pinned cores (the CPU form of a disaggregated cluster);
        otherwise the cores are shared. The trainer ranks get the placement's cores unless
        actor_config.cpu_cores / num_threads say otherwise. None on accelerators."""
        from asp_npu.device import available_devices, node_placement

        act, gen = self.cfg.actor_config, self.cfg.generate_config
        per_node = self.cfg.trainer.n_devices_per_node or available_devices(self.kind)  # type: ignore[arg-type]
        self.K = instance_count(self.cfg, self.spec.colocated, per_node * max(1, self.cfg.trainer.nnodes))
        world = act.tensor_model_parallel_size * act.pipeline_model_parallel_size * act.data_parallel_size
        placement = node_placement(self.kind, per_node, self.K, gen.infer_tensor_parallel_size, world,  # type: ignore[arg-type]
                                   self.spec.colocated)
        if placement is None:
            return None
        if not act.cpu_cores and placement.disjoint:
            act.cpu_cores = ",".join(str(c) for c in placement.trainer_cores)
        if not act.num_threads:  # a shared asynchronous trainer gets the cores the instances leave
            busy = 0 if placement.disjoint or self.spec.colocated else self.K * gen.infer_tensor_parallel_size
            act.num_threads = max(1, (len(placement.trainer_cores) - busy) // world)
        return placement

    def _make_predictor(self) -> Any:
        from asp_npu.predict.factory import make_predictor

        return make_predictor(self.cfg.rl_config.predictor)

    def start(self) -> None:
        """Ray, the queue actor, the instances (engines built in parallel) and the trainer group."""
        import ray

        from asp_npu.device import loopback_env
        from asp_npu.pipeline.queue_actor import make_queue_actor
        from asp_npu.rollout.engine import EngineSettings, SamplingSettings
        from asp_npu.rollout.instance import launch_instances
        from asp_npu.trainer.group import TrainerGroup

        cfg, gen = self.cfg, self.cfg.generate_config
        if self.kind == "cpu":
            for k, v in loopback_env().items():
                os.environ.setdefault(k, v)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        os.environ.setdefault("RAY_DEDUP_LOGS", "1")
        if not ray.is_initialized():
            act = cfg.actor_config
            world = act.tensor_model_parallel_size * act.pipeline_model_parallel_size * act.data_parallel_size
            ray.init(num_cpus=self.K * gen.infer_tensor_parallel_size + world + 1, include_dashboard=False,
                     log_to_driver=True, logging_level="warning")
            self._owns_ray = True
        self.queue = make_queue_actor(self.mb_groups, self.mb_groups * self.k, self.max_lag, self.G,
                                      self.spec.queue_order)
        sc = gen.sampling_config
        max_len = gen.max_model_len or (cfg.rl_config.max_prompt_length + sc.max_tokens)
        settings = EngineSettings(
            model_path=cfg.model.path, dtype=cfg.model.dtype, max_num_seqs=gen.max_num_seqs,
            max_num_batched_tokens=gen.max_num_batched_tokens, max_model_len=max_len,
            enforce_eager=gen.enforce_eager, gpu_memory_utilization=gen.gpu_memory_utilization,
            seed=cfg.data.seed, enable_prefix_caching=self.drain)
        self.sampling = SamplingSettings(n=self.G, temperature=sc.temperature, top_p=sc.top_p,
                                         max_tokens=sc.max_tokens, seed=cfg.data.seed)
        self.instances = launch_instances(self.K, settings, self.sampling, kind=self.kind,
                                          kv_cache_gib=gen.kv_cache_gib,
                                          devices_per_instance=gen.infer_tensor_parallel_size,
                                          sink=self.queue, admission=self.spec.admission, keep_polled=False,
                                          placement=self.placement)
        self.trainer = TrainerGroup(cfg)
        self._warm_up()
        if any(p.prompt_token_ids is None for p in self.prompts):
            self._tok()  # loading the tokenizer (importing transformers) takes seconds: not on the clock
        self._resume()

    def _resume(self) -> None:
        """`actor_config.load`: restore the trainer (model, optimizer, RNG, step) and give every
        instance its weights; planning continues with the window after the checkpoint's step.
        The length predictor starts cold (its history is not checkpointed)."""
        load = self.cfg.actor_config.load
        if not load:
            return
        step = int(self.trainer.load(load)["step"])
        self.step = self.version = self.base = step
        self.next_window = step // self.steps_per_window
        self._publish_weights()
        self._refresh_all_and_wait()

    def _warm_up(self) -> None:
        """One short generation per instance before the clock starts: the first generate of a vLLM
        process pays a one-off warm-up (seconds on CPU) that would otherwise land on iteration 1."""
        import ray

        from asp_npu.pipeline.queue_actor import WARMUP_PREFIX
        from asp_npu.rollout.instance import UnitSpec

        base = self.prompts[0]
        refs = []
        for i, inst in enumerate(self.instances):
            item = PromptItem(f"{WARMUP_PREFIX}{i}@0", base.prompt_token_ids, base.text, base.ground_truth,
                              {**base.meta, "epoch": 0})
            ray.get(inst.add_prompts.remote([item]))
            samples = tuple((item.prompt_id, k) for k in range(min(self.G, self.slots)))
            ray.get(inst.submit_units.remote([UnitSpec(-1 - i, samples)]))
            refs.append(inst.wait_idle.remote(120.0))
        ray.get(refs)

    def close(self) -> None:
        import ray

        self._pool.shutdown(wait=True, cancel_futures=True)
        if self.instances:
            try:
                ray.get([a.shutdown.remote() for a in self.instances], timeout=60)
            except Exception:  # noqa: BLE001 - best effort; the actors are killed below anyway
                pass
            for a in self.instances:
                ray.kill(a)
            self.instances = []
        if self.trainer is not None:
            self.trainer.shutdown()
            self.trainer = None
        if self.queue is not None:
            ray.kill(self.queue)
            self.queue = None
        self.metrics.close()
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()

    # ------------------------------------------------------------------ planning
    def _tok(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.cfg.model.path)
        return self._tokenizer

    def _prompt_len(self, item: PromptItem) -> int:
        from asp_npu.data.datasets import encode_prompt

        if item.prompt_token_ids is not None:
            return len(item.prompt_token_ids)
        return len(encode_prompt(item, self._tok()))

    def plan_window(self) -> Window | None:
        """Predict, plan and enqueue the next window's units; None when every window is planned."""
        import ray

        from asp_npu.schedule.baselines import fifo_plan
        from asp_npu.schedule.cost import CostModel
        from asp_npu.schedule.plan import Groups
        from asp_npu.schedule.planner import PlannerConfig, plan

        if self.next_window >= self.n_windows:
            return None
        w = self.next_window
        self.next_window += 1
        items = self._window_items(w)
        plens = np.array([self._prompt_len(it) for it in items], dtype=np.int64)
        est = self.predictor.predict_many(np.array([it.meta["base_id"] for it in items], dtype=str), plens)
        groups = Groups(np.array([it.prompt_id for it in items], dtype=str),
                        np.tile(np.arange(self.G, dtype=np.int64), (len(items), 1)),
                        np.maximum(est.mean, 1.0), np.maximum(est.q50, 1.0), np.maximum(est.q90, 1.0), plens)
        rl = self.cfg.rl_config
        pcfg = PlannerConfig(num_instances=self.K, minibatch=self.M, group_size=self.G,
                             max_num_seqs=self.slots, max_lag=self.max_lag, train_step_s=self.train_step_s,
                             cost=CostModel(rl.plan_cost_a, rl.plan_cost_b, 0.0), seed=self.cfg.data.seed + w)
        p = plan(groups, pcfg) if self.spec.planner == "asp" else fifo_plan(groups, pcfg)
        p.write_json(self.run_dir.plans / f"window_{w:04d}.json")
        win = Window(w, items, plan_summary=dict(p.summary))
        if self.spec.dispatch == "stream":
            # one unit per group; which group an asking instance starts is StreamDispatcher's choice
            self.dispatcher.add(groups.prompt_ids.tolist(), groups.q90.tolist())
            for g, pred in zip(groups.prompt_ids.tolist(), groups.mean.tolist(), strict=True):
                self._add_unit(win, -1, [g], [(g, k) for k in range(self.G)], pred * self.G)
        else:
            order = [int(u) for inst in p.instance_units for u in inst] \
                if self.spec.dispatch == "static" else list(range(p.num_units))
            per_instance = {int(u): k for k, inst in enumerate(p.instance_units) for u in inst}
            for u in sorted(order) if self.spec.dispatch == "pull" else order:
                du = p.unit(u)
                self._add_unit(win, per_instance[u] if self.spec.dispatch == "static" else -1,
                               list(dict.fromkeys(s.prompt_id for s in du.samples)),
                               [(str(s.prompt_id), int(s.sample_idx)) for s in du.samples],
                               float(du.predicted_tokens))
        if self.spec.dispatch == "static":
            for pu in win.units:
                self.pending[pu.instance].append(pu.uid)
        else:
            self.pull.extend(pu.uid for pu in win.units)
        self.windows[w] = win
        ray.get([a.add_prompts.remote(items) for a in self.instances])
        return win

    def _add_unit(self, win: Window, instance: int, groups: list[str], samples: list[tuple[str, int]],
                  predicted_tokens: float) -> None:
        pu = PlannedUnit(len(self.units), win.index, instance, groups, samples, predicted_tokens)
        self.units[pu.uid] = pu
        for g in groups:
            self.group_unit[g] = pu.uid
        win.units.append(pu)

    # ------------------------------------------------------------------ dispatch
    def _next_unit_for(self, i: int) -> int | None:
        if self.spec.dispatch == "static":
            return self.pending[i][0] if self.pending[i] else None
        if not self.pull:
            return None
        if self.spec.dispatch == "pull":
            return self.pull[0]
        window = self.units[self.pull[0]].window  # the oldest window's groups go first
        cands = [u for u in self.pull if self.units[u].window == window]
        return cands[self.dispatcher.choose([self.units[u].groups[0] for u in cands], i)]

    def _pop_unit_for(self, i: int, uid: int) -> None:
        if self.spec.dispatch == "static":
            self.pending[i].popleft()
        elif self.spec.dispatch == "pull":
            self.pull.popleft()
        else:
            self.pull.remove(uid)

    def _window_ready(self) -> bool:
        """More work can be planned: some instance (static) or the shared list (pull) ran dry."""
        if self.spec.dispatch == "static":
            return any(not q for q in self.pending)
        return not self.pull

    def _outstanding(self, i: int) -> int:
        """Samples submitted to instance i and not yet delivered."""
        units = (self.units[u] for u in self.inflight_units[i])
        return sum(len(u.samples) - u.done_groups * self.G for u in units)

    def _room(self, i: int) -> bool:
        """Unit admission: the running unit plus `lookahead_units` queued; continuous: a sample backlog."""
        if self.spec.admission == "unit":
            return len(self.inflight_units[i]) <= self.spec.lookahead_units
        return self.spec.colocated or self._outstanding(i) < 2 * self.slots

    def dispatch(self, now: float) -> None:
        """Submit admitted units, least-loaded instance first, up to each instance's room."""
        import ray

        from asp_npu.rollout.instance import UnitSpec

        done: set[int] = set()
        while True:
            for i in range(self.K):
                if i not in done and not self._room(i):
                    self.inst_records[i].set_blocked(now, False)
                    done.add(i)
            cands = [i for i in range(self.K) if i not in done]
            if not cands:
                return
            i = min(cands, key=lambda j: (self._outstanding(j), j))
            uid = self._next_unit_for(i)
            if uid is None and self.auto_plan and self._window_ready() and self.plan_window() is not None:
                uid = self._next_unit_for(i)
            if uid is None:
                self.inst_records[i].set_blocked(now, False)
                done.add(i)
                continue
            pu = self.units[uid]
            if not ray.get(self.queue.admit.remote(pu.groups, self._ledger_version(self.inst_version[i]))):
                if self.spec.dispatch == "stream":
                    self.dispatcher.unplace(pu.groups[0])
                self.inst_records[i].set_blocked(now, not self.inflight_units[i])
                done.add(i)
                continue
            self.inst_records[i].set_blocked(now, False)
            self._pop_unit_for(i, uid)
            pu.submitted_to, pu.t_submit = i, now
            self.instances[i].submit_units.remote([UnitSpec(uid, tuple(pu.samples))])
            self.inflight_units[i].add(uid)

    def on_arrivals(self, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            uid = self.group_unit[r["group"]]
            self.dispatcher.done(r["group"])
            pu = self.units[uid]
            pu.done_groups += 1
            if pu.done_groups == len(pu.groups):
                self.inflight_units[pu.submitted_to].discard(uid)
            base, epoch = r["group"].rsplit("@", 1)
            for n in r["lens"]:
                self.predictor.observe(base, int(epoch), int(n), int(r["prompt_len"]))
            self.tokens_arrived += int(r["tokens"])

    # ------------------------------------------------------------------ weights
    def _gather_weights(self) -> tuple[bytes, float, float]:
        """The trainer's full HF weights as safetensors bytes (trainer thread; the trainer is paused)."""
        t0 = time.time()
        blob = self.trainer.get_hf_weights().to_safetensors_bytes(self.cfg.model.dtype)
        return blob, t0, time.time()

    def _publish_weights(self, gathered: tuple[bytes, float, float] | None = None) -> None:
        """Put the new weights in the object store once; every instance pulls them from there."""
        import ray

        blob, t0, t1 = gathered or self._gather_weights()
        self.blob_ref = ray.put(blob)
        self.blob_version = self.version
        self.trainer_record.paused.append((t0, t1))

    def refresh_instances(self, now: float) -> None:
        """Start a refresh on every instance behind the latest weights (one in flight per instance)."""
        for i in range(self.K):
            if self.refreshing[i] is None and self.blob_ref is not None and \
                    self.inst_version[i] < self.blob_version:
                ref = self.instances[i].refresh_weights.remote(self.blob_ref, self.blob_version, self.drain)
                self.refreshing[i] = (ref, self.blob_version)
                self.refresh_started[i] = now

    def _refresh_all_and_wait(self) -> None:
        """Bring every instance to the published weights before generating (sync modes, resume)."""
        if self.blob_ref is None:
            return
        self.refresh_instances(time.time())
        while any(r is not None for r in self.refreshing):
            self.poll_refreshes()
            time.sleep(POLL_S)

    def poll_refreshes(self) -> None:
        import ray

        for i in range(self.K):
            if self.refreshing[i] is None:
                continue
            ref, v = self.refreshing[i]
            ready, _ = ray.wait([ref], timeout=0)
            if ready:
                rep = ray.get(ref)
                t_end = time.time()
                load = max(0.0, float(rep["total_s"]) - float(rep["drain_s"]))
                self.inst_records[i].paused.append((t_end - load, t_end))
                self.refresh_reports.append({**rep, "t_end": t_end})
                self.inst_version[i] = v
                self.refreshing[i] = None

    # ------------------------------------------------------------------ training
    def _train(self, batch: TrainBatch, gather: bool = False) -> tuple[dict[str, float], float, float, Any]:
        """One trainer step; with `gather`, also the new weights for a refresh (same thread, in order)."""
        t0 = time.time()
        out = self.trainer.train_step(batch)
        t1 = time.time()
        return out, t0, t1, self._gather_weights() if gather else None

    def _ledger_version(self, weights_step: int) -> int:
        """The lag ledger's version of weights after `weights_step` trainer steps (counted from `base`)."""
        return (weights_step - self.base) // self.k

    def _on_step(self, handout: dict[str, Any], out: dict[str, float], t0: float, t1: float,
                 waited_s: float, extra: dict[str, float] | None = None) -> None:
        """Record one finished trainer step: ledger, metrics row, version bump."""
        trajs: list[Trajectory] = handout["trajectories"]
        self.trainer_record.busy.append((t0, t1))
        self.train_step_s = (t1 - t0) if not self.train_step_s else 0.7 * self.train_step_s + 0.3 * (t1 - t0)
        offset = self.base // self.k  # ledger numbers -> run-wide numbers after a resume
        ledger_step = handout["step"] + offset
        lags = [ledger_step - self._ledger_version(t.policy_version) - offset for t in trajs]
        stale_steps = [self.step - t.policy_version for t in trajs]
        for t in trajs:
            base, epoch = t.prompt_id.rsplit("@", 1)
            self.samples_rows.append({
                "prompt_id": base, "epoch": int(epoch), "sample_idx": t.sample_idx, "instance": t.instance,
                "policy_version": self._ledger_version(t.policy_version) + offset,
                "weights_step": t.policy_version,
                "weights_step_last": max(t.policy_version, t.policy_version_last),
                "step": ledger_step, "trainer_step": self.step, "response_len": t.response_len,
                "prompt_len": len(t.prompt_token_ids),
                "reward": t.reward, "t_finished": t.t_finished,
            })
        lens = [t.response_len for t in trajs]
        iteration_s = t1 - self._last_step_end
        tokens = sum(lens)
        row: dict[str, Any] = {
            "iteration": self.step // self.steps_per_window,
            "policy_version": self.version + 1,
            "samples/consumed": (self.step + 1) * self.M,
            M.TIMING_ROLLOUT: waited_s,
            M.TIMING_UPDATE: t1 - t0,
            M.TIMING_ITERATION: iteration_s,
            M.E2E_TPS: tokens / iteration_s if iteration_s > 0 else 0.0,
            M.VLLM_TPS: self._arrived_tokens_since / iteration_s / self.K if iteration_s > 0 else 0.0,
            M.RESPONSE_LEN_MEAN: float(np.mean(lens)),
            M.RESPONSE_LEN_MAX: float(max(lens)),
            M.RESPONSE_LEN_MIN: float(min(lens)),
            M.REWARD_MEAN: float(np.mean([t.reward for t in trajs])),
            M.LAG_MEAN: float(np.mean(lags)),
            M.LAG_MAX: float(max(lags)),
            "async/staleness_steps_max": float(max(stale_steps)),
            M.QUEUE_OCCUPANCY: handout["queued_before"] * self.G,
            M.TRAINER_IDLE: 1.0 - (t1 - t0) / iteration_s if iteration_s > 0 else 0.0,
            **{f"actor/{k}": v for k, v in out.items() if isinstance(v, int | float)},
            **(extra or {}),
        }
        self._arrived_tokens_since = 0
        self.step += 1
        self.version += 1
        self.versions.append((t1, self.version))
        self.step_ends.append(t1)
        if self.step % self.steps_per_window == 0:
            self.iterations.append(t1)
        self._last_step_end = t1
        self._pending_row = row

    def _log_row(self, extra: dict[str, float] | None = None) -> None:
        row = {**self._pending_row, **(extra or {})}
        self.metrics.log(self.step, row)

    def _maybe_save(self) -> None:
        f = self.cfg.trainer.save_freq
        if f > 0 and self.step % f == 0 and self.step < self.total_steps:
            self.trainer.save(str(self.run_dir.checkpoints / f"step_{self.step:06d}"))

    # ------------------------------------------------------------------ loops
    def run(self) -> dict[str, Any]:
        import ray

        self.t_start = self._last_step_end = time.time()
        self.versions.append((self.t_start, self.version))
        runner = self._run_sync if self.spec.colocated else self._run_async
        runner()
        t_end = time.time()
        final = self.cfg.trainer.save_freq >= 0
        if final:
            self.trainer.save(str(self.run_dir.checkpoints / "final"))
        stats = ray.get([a.stats.remote() for a in self.instances])
        errors = [e for s in stats for e in s["errors"]]
        series = ray.get(self.queue.series.remote())
        summary = self._finish(stats, series, t_end)
        if errors:
            summary["instance_errors"] = errors[:20]
        return summary

    def _progress_guard(self, last_progress: float, timeout: float) -> None:
        import ray

        if time.time() - last_progress > timeout:
            stats = ray.get([a.stats.remote() for a in self.instances])
            errors = [e["error"] for s in stats for e in s["errors"]]
            state = ray.get(self.queue.state.remote())
            raise UserError(f"pipeline made no progress for {timeout:.0f}s (queue {state}); "
                            f"instance errors: {errors[:3] or 'none'}")

    def _wait_events(self, timeout: float) -> list[dict[str, Any]]:
        """Block until a group arrives, a weight refresh ends or the trainer wakes the queue (or
        `timeout`); returns the new arrival rows. The control plane shares the cores with rollout and
        training on CPU, so it sleeps between events rather than polling."""
        import ray

        if self._arrivals_ref is None:
            self._arrivals_ref = self.queue.wait_arrivals.remote(self.arrivals_seen, timeout, self._wakes)
        refreshing = [r[0] for r in self.refreshing if r is not None]
        ready, _ = ray.wait([self._arrivals_ref, *refreshing], num_returns=1, timeout=timeout)
        if self._arrivals_ref not in ready:
            return []
        got = ray.get(self._arrivals_ref)
        self._arrivals_ref = None
        self._wakes = got["wakes"]
        rows = got["rows"]
        if rows:
            self.arrivals_seen += len(rows)
            self._arrived_tokens_since += sum(int(r["tokens"]) for r in rows)
            self.on_arrivals(rows)
        return rows

    def _run_async(self) -> None:
        import ray

        train_future: Future | None = None
        handout: dict[str, Any] | None = None
        waited_from = time.time()
        last_progress = time.time()
        while self.step < self.total_steps:
            self.dispatch(time.time())
            if train_future is None:
                h = ray.get(self.queue.get_batch.remote(0.0))
                if h is not None:
                    handout = h
                    batch = TrainBatch(h["trajectories"], self.G, self.step)
                    refresh = (self.step + 1) % self.k == 0 and self.step + 1 < self.total_steps
                    train_future = self._pool.submit(self._train, batch, refresh)
                    train_future.add_done_callback(lambda _f: self.queue.wake.remote())
                    continue  # the handout may have opened admission
            if self._wait_events(WAIT_S):
                last_progress = time.time()
            self.poll_refreshes()
            if train_future is not None and train_future.done():
                out, t0, t1, gathered = train_future.result()
                assert handout is not None
                self._on_step(handout, out, t0, t1, t0 - waited_from)
                train_future, handout = None, None
                if gathered is not None:
                    self._publish_weights(gathered)
                    self.refresh_instances(time.time())
                self._log_row()
                self._maybe_save()
                waited_from = time.time()
                last_progress = waited_from
            self._progress_guard(last_progress, self.cfg.trainer.stall_timeout_s)

    def _run_sync(self) -> None:
        """MindSpeed-RL integrated worker: generate a whole window, pause engines, train all its steps."""
        import ray

        for _ in range(self.next_window, self.n_windows):
            t_gen = time.time()
            self._end_lent(t_gen)
            # wake up: resume engines, load the newest weights everywhere, then generate
            ray.get([a.resume.remote() for a in self.instances])
            self._refresh_all_and_wait()
            win = self.plan_window()
            assert win is not None
            expected = sum(len(u.groups) for u in win.units)
            got = 0
            last_progress = time.time()
            while got < expected:
                self.dispatch(time.time())
                rows = self._wait_events(WAIT_S)
                if rows:
                    got += len(rows)
                    last_progress = time.time()
                self._progress_guard(last_progress, self.cfg.trainer.stall_timeout_s)
            t_pause = time.time()
            ray.get([a.pause.remote() for a in self.instances])  # engines sleep while the trainer runs
            t_train = time.time()
            self.trainer_record.lent.append((t_gen, t_train))
            for rec in self.inst_records:
                rec.paused.append((t_pause, t_train))
            for _s in range(self.steps_per_window):
                waited_from = time.time()
                h = ray.get(self.queue.get_batch.remote(30.0))
                if h is None:
                    raise UserError("mindspeed-sync: the queue refused a minibatch of a generated window")
                out, t0, t1, _ = self._train(TrainBatch(h["trajectories"], self.G, self.step))
                self._on_step(h, out, t0, t1, t_train - t_gen if _s == 0 else t0 - waited_from)
                if self.step % self.steps_per_window == 0 and self.step < self.total_steps:
                    self._publish_weights()
                self._log_row()
                self._maybe_save()
            self._lent_since = t_train

    def _end_lent(self, t: float) -> None:
        """Colocated: the devices go back from the trainer to the engines (or the run ends)."""
        if self._lent_since is not None:
            for rec in self.inst_records:
                rec.lent.append((self._lent_since, t))
            self._lent_since = None

    # ------------------------------------------------------------------ results
    def _finish(self, stats: list[dict[str, Any]], series: dict[str, Any], t_end: float) -> dict[str, Any]:
        from asp_npu.observe import timeline
        from asp_npu.observe.bubbles import account

        self._end_lent(t_end)
        for rec in self.inst_records:
            rec.close(t_end)
        labels = {u.uid: f"w{u.window}/u{u.uid}" for u in self.units.values()}
        log = build_event_log(stats, self.inst_records, self.trainer_record, self.slots,
                              self._trainer_world(), self.spec.colocated, self.t_start, t_end, series,
                              self.versions, self.iterations, labels, self.G)
        log.meta = {"mode": self.spec.name, "label": self.label}
        log.write(self.run_dir / rd.EVENTS)
        timeline.write_timeline(self.run_dir / rd.TIMELINE, log, self.t_start, t_end)
        rep = account(log, self.t_start, t_end)
        q = [(t, n * self.G) for t, n in zip(series["t"], series["queued"], strict=False)]
        self.run_dir.write_jsonl(rd.QUEUE, [{"t": t, "occupancy": n} for t, n in q])
        self.run_dir.write_jsonl(rd.SAMPLES, self.samples_rows)
        tokens = sum(r["response_len"] for r in self.samples_rows)
        span = (self.step_ends[-1] if self.step_ends else t_end) - self.t_start
        it_ends = [self.t_start, *self.iterations]
        it_times = [b - a for a, b in zip(it_ends, it_ends[1:], strict=False)]
        rewards = [r for r in (row.get(M.REWARD_MEAN) for row in self.metrics.history) if r is not None]
        lags = [r["step"] - r["policy_version"] for r in self.samples_rows]
        bubbles = {"utilization": rep.utilization, **rep.bubbles()}
        extra = {f"bubbles/{k}": v for k, v in bubbles.items()}
        extra.update({M.TRAINER_IDLE: rep.trainer_idle_ratio, M.ROLLOUTER_IDLE: rep.rollouter_idle_ratio})
        self.metrics.log(self.step, {"final": 1, **extra}, console=False)
        summary = {
            "mode": self.spec.name,
            "label": self.label,
            "max_lag": self.max_lag,
            "instances": self.K,
            "placement": None if self.placement is None else {
                "disjoint": self.placement.disjoint,
                "instance_cores": [list(c) for c in self.placement.instance_cores],
                "trainer_cores": self.cfg.actor_config.pinned_cores() or list(self.placement.trainer_cores),
            },
            "steps": self.step,
            "iterations": len(self.iterations),
            "samples": len(self.samples_rows),
            "tokens": tokens,
            "wall_s": span,
            "throughput_tokens_per_s": tokens / span if span > 0 else 0.0,
            "throughput_samples_per_s": len(self.samples_rows) / span if span > 0 else 0.0,
            "iteration_time_mean_s": float(np.mean(it_times)) if it_times else 0.0,
            "step_time_mean_s": span / max(1, self.step),
            "final_reward": float(np.mean(rewards[-max(1, len(rewards) // 4):])) if rewards else 0.0,
            "reward_curve": rewards,
            "lag_max": max(lags) if lags else 0,
            "lag_mean": float(np.mean(lags)) if lags else 0.0,
            "bubbles": bubbles,
            "trainer_idle_ratio": rep.trainer_idle_ratio,
            "rollouter_idle_ratio": rep.rollouter_idle_ratio,
            "bubble_coverage": rep.coverage,
            "weight_refresh_s_mean": float(np.mean([r["total_s"] for r in self.refresh_reports]))
            if self.refresh_reports else 0.0,
            "queue": series["summary"],
            "planned_groups": len(self.group_unit),
            "planned_samples": sum(len(u.samples) for u in self.units.values()),
            "windows": {w.index: w.plan_summary for w in self.windows.values()},
        }
        self.run_dir.write_summary(summary)
        return summary

    def _trainer_world(self) -> int:
        a = self.cfg.actor_config
        return a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.data_parallel_size
