"""The discrete-event loop: K continuous-batching instances, a trainer, the real TrainQueue, a virtual clock.

Nothing steps single tokens. An instance's batch is constant between its events, so the time to its
next sequence completion is closed-form (`cost.decode_seconds`); admissions, weight refreshes and
colocated switches happen at step boundaries (`cost.steps_to_reach`). Events are (time, kind,
instance, tag); a tag change invalidates an instance's stale completion event.

What differs between modes is data, not code paths (the mode table, `asp_npu.core.modes`): where an
instance gets its next work (a static per-instance list -- contiguous shares, round-robin or the ASP
plan -- or a global FIFO it pulls from), whether it runs one unit at a time or streams, the lag
bound and refresh period, a rollout barrier per iteration, colocated switching, and the trainer's
padding model. Admission and lag always go through `asp_npu.core.train_queue.TrainQueue`, and
the run is recorded in an `asp_npu.observe.events.EventLog` for the one bubble accounting.

Multi-turn trajectories (a workload with `turns`): a sample decodes its turns as segments; when a
turn ends with a tool call the sample leaves its instance's batch (slot and KV freed, as an agent
loop's generate call returns) and a `_TOOL_DONE` event puts it back in that instance's waiting queue
after the tool's latency; re-admitted, it prefills only the tool's output (the prompt and earlier
turns are a prefix-cache hit) and decodes its next turn with the instance's weights at that moment
(a new token segment when they changed during the wait). Its group stays admitted and in flight all
along, so the lag ledger and partial rollout's restamp count across turns.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from asp_npu.core.feed import Feed, make_feed
from asp_npu.core.records import Unit
from asp_npu.core.train_queue import QueuedGroup, TrainQueue
from asp_npu.observe.events import EventLog
from asp_npu.sim.cost import SimCost, decode_seconds, steps_to_reach, train_seconds
from asp_npu.sim.workload import Workload

_INST, _REFRESH_DONE, _TRAIN_END, _TRAINER_FREE, _TOOL_DONE = range(5)

# A work source returns window `it`'s units (groups = the workload's group indices), in dispatch order.
UnitSource = Callable[[int], list[Unit[int]]]


@dataclass(frozen=True)
class RunSpec:
    """One simulated run: the mode's behaviour plus the layout it gets."""

    mode: str
    colocated: bool
    instances: int
    slots: int  # max_num_seqs per instance
    instance_devices: int  # inference TP
    trainer_devices: int
    minibatch_groups: int  # groups per trainer step
    version_groups: int  # groups consumed per weights version (refresh)
    max_lag: int
    dispatch: str = "static"  # the feed (asp_npu.core.feed): static | pull | stream
    steal: bool = False  # static feed: an instance out of work takes undispatched units of others
    preempt: bool = False  # colocated: training may start while sequences run (suspended, resumed later)
    unit_exec: bool = False  # one unit at a time per instance (else: stream into free slots)
    barrier: bool = False  # iteration i+1 is dispatched only after iteration i is fully generated
    trainer_padded: bool = False
    order: str = "fifo"  # TrainQueue handout order within a deadline
    devices: int = 0  # physical devices of the job (for the accounting check)
    partial_rollout: bool = False  # lag counted from a group's newest weights; tokens within max_token_lag
    max_token_lag: int | None = None  # partial rollout: bound on the oldest token's lag


class WorkPool:
    """The run's feed (`asp_npu.core.feed`, shared with the Ray controller) plus the simulator's window
    materialisation: window `it` is laid out (`units_for(it)`) when an instance first asks beyond the
    planned windows and `available(it)` allows it (with a barrier: once the previous one is generated).
    """

    def __init__(self, feed: Feed, units_for: UnitSource, available: Callable[[int], bool],
                 n_windows: int) -> None:
        self.feed, self.units_for, self.available, self.n_windows = feed, units_for, available, n_windows
        self.next_window = 0

    def _materialize_next(self) -> bool:
        if not self.available(self.next_window):
            return False
        self.feed.add(self.units_for(self.next_window))
        self.next_window += 1
        return True

    def peek(self, i: int) -> Unit[int] | None:
        """Instance i's next unit (planning windows as needed), None when none may start now."""
        while True:
            u = self.feed.peek(i)
            if u is not None:
                return u
            if not self._materialize_next():
                return None

    def pop(self, unit: Unit[int]) -> None:
        self.feed.take(unit)


@dataclass
class _Instance:
    idx: int
    slots: int
    t: float = 0.0  # time of the current step boundary
    step: int = 0
    kv: float = 0.0
    n: int = 0
    heap: list = field(default_factory=list)  # (finish_step, sample)
    waiting: deque = field(default_factory=deque)  # admitted samples without a slot
    cur: deque = field(default_factory=deque)  # stream mode: groups of the current unit not yet admitted
    cur_iter: int = -1
    version: int = 0
    pending_version: int = 0
    loading_version: int = 0
    paused: bool = False
    lent: bool = False
    tag: int = 0
    target: int = 0  # step of the scheduled event
    state: str = ""
    logged: tuple = ()
    unit_left: int = 0  # unit mode: samples of the running unit not finished
    groups: set = field(default_factory=set)  # groups admitted here and not finished


@dataclass
class RunResult:
    spec: RunSpec
    log: EventLog
    queue: TrainQueue
    iteration_ends: list[float]
    tokens_generated: int
    samples_consumed: int
    tokens_consumed: int
    wall_s: float
    lags: list[int]
    token_lag_hist: dict[int, int] = field(default_factory=dict)  # lag at consumption -> tokens


class Simulation:
    """Run `workload` under `spec` and `cost`; `units_for(it)` lays out iteration `it`'s work."""

    def __init__(
        self,
        spec: RunSpec,
        workload: Workload,
        cost: SimCost,
        units_for: UnitSource,
        on_group_done: Callable[[int], None] | None = None,
        n_windows: int | None = None,
    ) -> None:
        self.spec, self.w, self.cost = spec, workload, cost
        self.units_for = units_for
        self.on_group_done = on_group_done
        n = workload.group_size
        self.n = n
        self.resp = workload.response_len.ravel().tolist()
        self.cur_end = list(self.resp)  # model tokens at the end of the sample's current turn
        self.mt = workload.turns is not None
        if workload.turns is not None:
            self._init_turns(workload)
        self.audit: list[tuple[float, str, int, int]] | None = None  # tests: (t, what, sample, instance)
        self.prompt = np.repeat(workload.prompt_len, n).tolist()
        self.group_left = [n] * workload.num_groups
        self.group_tokens = workload.response_len.sum(axis=1).tolist()
        self.group_iter = workload.iteration.tolist()
        self.iter_left = np.bincount(workload.iteration, minlength=workload.num_iterations).tolist()
        self.n_iter = workload.num_iterations
        self.queue = TrainQueue(
            spec.minibatch_groups, spec.version_groups, spec.max_lag, order=spec.order,
            max_token_lag=spec.max_token_lag if spec.partial_rollout else None,
        )
        self.group_started = [0] * workload.num_groups  # samples of each group that got a slot
        self.segments: dict[int, list[tuple[int, int]]] = {}  # sample -> [(weights version, from token)]
        self.token_lag_hist: dict[int, int] = {}
        self.log = EventLog(
            devices=spec.devices, trainer_devices=spec.trainer_devices, colocated=spec.colocated
        )
        self.inst = [_Instance(i, spec.slots) for i in range(spec.instances)]
        for _ in self.inst:
            self.log.add_instance(spec.instance_devices, spec.slots)
        self.events: list = []
        self.seq = 0
        feed = make_feed(spec.dispatch, spec.instances, spec.version_groups, spec.steal)
        self.pool = WorkPool(feed, units_for, self._iter_available, n_windows or workload.num_iterations)
        self.trainer_busy = False
        self.trainer_state = ""
        self.version = 0  # published weights version
        self.iteration_ends: list[float] = []
        self.tokens = 0
        self.samples_consumed = 0
        self.tokens_consumed = 0
        self.sample_unit: dict[int, int] = {}
        self.unit_info: dict[int, list] = {}
        self.next_unit_id = 0

    def _init_turns(self, workload: Workload) -> None:
        tr = workload.turns
        assert tr is not None
        self.tool_len = workload.tool_len
        self.turn_lo = tr.offsets[:-1].tolist()
        self.turn_n = tr.counts.tolist()
        self.t_model, self.t_tool_tok = tr.model.tolist(), tr.tool_tokens.tolist()
        self.t_tool_s = tr.tool_s.tolist()
        self.cur_end = [self.t_model[lo] for lo in self.turn_lo]
        S = len(self.resp)
        self.turn = [0] * S  # current turn of each sample
        self.done_tok = [0] * S  # model tokens decoded before the current turn
        self.tool_ctx = [0] * S  # tool-output tokens in the context so far

    # ------------------------------------------------------------------------------------ helpers
    def _push(self, t: float, kind: int, i: int = -1, tag: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, i, tag))

    def _log_inst(self, inst: _Instance, state: str) -> None:
        key = (inst.n, state)
        if key != inst.logged:
            self.log.instance_state(inst.t, inst.idx, inst.n, state)
            inst.logged = key
        inst.state = state

    def _log_trainer(self, t: float, state: str, useful: float = 1.0) -> None:
        self.log.trainer_state(t, state, useful)
        self.trainer_state = state

    def _iter_available(self, it: int) -> bool:
        """Window `it` may be dispatched (with a barrier: only once the previous one is fully generated)."""
        if it >= self.pool.n_windows:
            return False
        return not self.spec.barrier or it == 0 or self.iter_left[it - 1] == 0

    # ----------------------------------------------------------------------------------- instance
    def _advance(self, inst: _Instance, k: int) -> None:
        """Run k decode steps, then retire every sequence that has finished."""
        if k > 0:
            inst.t += decode_seconds(self.cost, k, inst.n, inst.kv)
            inst.step += k
            inst.kv += inst.n * k
            self.tokens += inst.n * k
        heap = inst.heap
        while heap and heap[0][0] <= inst.step:
            _, s = heapq.heappop(heap)
            inst.n -= 1
            if not self.mt:
                inst.kv -= self.prompt[s] + self.resp[s]
                self._sample_done(inst, s)
                continue
            inst.kv -= self.prompt[s] + self.cur_end[s] + self.tool_ctx[s]
            if self.audit is not None:
                self.audit.append((inst.t, "leave", s, inst.idx))
            if self.turn[s] + 1 < self.turn_n[s]:
                self._tool_call(inst, s)
            else:
                self._sample_done(inst, s)

    def _tool_call(self, inst: _Instance, s: int) -> None:
        """Turn `turn[s]` ended with a tool call: the sample holds no slot until the tool answers."""
        j = self.turn_lo[s] + self.turn[s]
        self.tool_ctx[s] += self.t_tool_tok[j]
        self.done_tok[s] = self.cur_end[s]
        self.turn[s] += 1
        self.cur_end[s] += self.t_model[j + 1]
        self._push(inst.t + self.t_tool_s[j], _TOOL_DONE, inst.idx, s)

    def _tool_done(self, t: float, i: int, s: int) -> None:
        """The tool answered: the sample waits for a slot on its instance (its prefix cache is there)."""
        inst = self.inst[i]
        if self.audit is not None:
            self.audit.append((t, "tool_done", s, i))
        inst.waiting.append(s)
        self._wake(inst, t)

    def _resume_turn(self, inst: _Instance, s: int) -> float:
        """Re-admit a sample after its tool call; returns the tokens to prefill (the tool's output)."""
        heapq.heappush(inst.heap, (inst.step + self.cur_end[s] - self.done_tok[s], s))
        if inst.version != self.segments[s][-1][0]:
            self.segments[s].append((inst.version, self.done_tok[s]))
        inst.n += 1
        inst.kv += self.prompt[s] + self.done_tok[s] + self.tool_ctx[s]
        return float(self.t_tool_tok[self.turn_lo[s] + self.turn[s] - 1])

    def _sample_done(self, inst: _Instance, s: int) -> None:
        uid = self.sample_unit.pop(s)
        info = self.unit_info[uid]
        info[3] -= 1
        if info[3] == 0:
            self.log.unit(info[0], info[1], info[2], inst.t, info[4])
            del self.unit_info[uid]
            if self.spec.unit_exec:
                inst.unit_left = 0
        g = s // self.n
        self.group_left[g] -= 1
        if self.group_left[g] == 0:
            inst.groups.discard(g)
            self.queue.put(g, samples=self.n, tokens=self.group_tokens[g], now=inst.t)
            self.log.queue(inst.t, self.queue.n_queued, self.queue.n_in_flight)
            it = self.group_iter[g]
            self.iter_left[it] -= 1
            self.pool.feed.done(g)
            if self.on_group_done is not None:
                self.on_group_done(g)
            if self.iter_left[it] == 0 and self.spec.barrier:
                self._wake_all(inst.t, exclude=inst.idx)
            self._try_train(inst.t)

    def _admit_groups(self, inst: _Instance, it: int, groups: list[int]) -> None:
        uid = self.next_unit_id
        self.next_unit_id += 1
        samples = [g * self.n + j for g in groups for j in range(self.n)]
        self.unit_info[uid] = [inst.idx, f"it{it}", inst.t, len(samples), len(samples)]
        for g in groups:
            self.queue.admit(g, inst.version, now=inst.t)
            inst.groups.add(g)
        for s in samples:
            self.sample_unit[s] = uid
        inst.waiting.extend(samples)
        if self.spec.unit_exec:
            inst.unit_left = len(samples)
        self.log.queue(inst.t, self.queue.n_queued, self.queue.n_in_flight)

    def _fill(self, inst: _Instance) -> None:
        """At a step boundary: start waiting samples, take more work if allowed, log the state."""
        if inst.paused or inst.lent:
            return
        spec = self.spec
        state = "run"
        prefill = 0.0
        while True:
            while inst.n < inst.slots and inst.waiting:
                s = inst.waiting.popleft()
                if self.audit is not None:
                    self.audit.append((inst.t, "start", s, inst.idx))
                if self.mt and self.turn[s] > 0:
                    prefill += self._resume_turn(inst, s)
                    continue
                heapq.heappush(inst.heap, (inst.step + self.cur_end[s], s))
                self.group_started[s // self.n] += 1
                self.segments[s] = [(inst.version, 0)]
                inst.n += 1
                inst.kv += self.prompt[s]
                prefill += self.prompt[s]
            if inst.n >= inst.slots:
                break
            if spec.unit_exec and inst.unit_left > 0:
                break  # the unit's stragglers run; the next unit waits (padding)
            if not inst.cur:
                unit = self.pool.peek(inst.idx)
                if unit is None:
                    state = "drained"  # nothing left (or the next iteration waits for the barrier)
                    break
                if spec.unit_exec:
                    if self.queue.capacity(inst.version) < len(unit.groups):
                        state = "blocked"
                        break
                    self.pool.pop(unit)
                    self._admit_groups(inst, unit.window, list(unit.groups))
                    continue
                self.pool.pop(unit)
                inst.cur = deque(unit.groups)
                inst.cur_iter = unit.window
            if self.queue.capacity(inst.version) < 1:
                state = "blocked"
                break
            self._admit_groups(inst, inst.cur_iter, [inst.cur.popleft()])
        self._log_inst(inst, state)
        if prefill:
            inst.t += prefill * self.cost.prefill_s_per_token
        self._schedule(inst)

    def _schedule(self, inst: _Instance) -> None:
        inst.tag += 1
        if inst.n == 0:
            return
        k = inst.heap[0][0] - inst.step
        inst.target = inst.step + k
        self._push(inst.t + decode_seconds(self.cost, k, inst.n, inst.kv), _INST, inst.idx, inst.tag)

    def _wake(self, inst: _Instance, t: float) -> None:
        """Bring an instance to its first step boundary at or after t (to admit, pause or lend)."""
        if inst.paused or inst.lent:
            return
        if inst.n == 0:
            inst.t = max(inst.t, t)
            self._at_boundary(inst)
            return
        if inst.n >= inst.slots and inst.pending_version <= inst.version:
            return  # full and nothing to do: its next completion will look again
        k_done = inst.heap[0][0] - inst.step
        k = min(k_done, steps_to_reach(self.cost, t - inst.t, inst.n, inst.kv))
        if inst.target - inst.step <= k and self._has_pending(inst):
            return  # already due at or before that boundary
        inst.tag += 1
        inst.target = inst.step + k
        self._push(inst.t + decode_seconds(self.cost, k, inst.n, inst.kv), _INST, inst.idx, inst.tag)

    def _has_pending(self, inst: _Instance) -> bool:
        return inst.n > 0 and inst.target > inst.step

    def _wake_all(self, t: float, exclude: int = -1) -> None:
        for inst in self.inst:
            if inst.idx != exclude and inst.state in ("blocked", "drained"):
                self._wake(inst, t)

    def _at_boundary(self, inst: _Instance) -> None:
        if inst.pending_version > inst.version and not self.spec.colocated:
            self._pause(inst)
            return
        self._fill(inst)

    def _pause(self, inst: _Instance) -> None:
        inst.paused = True
        inst.loading_version = inst.pending_version
        self._log_inst(inst, "paused")
        inst.t += self.cost.refresh_s
        inst.tag += 1
        self._push(inst.t, _REFRESH_DONE, inst.idx, inst.tag)

    def _new_weights(self, inst: _Instance, version: int) -> None:
        """Weights `version` are live on `inst` (at a step boundary): running sequences continue with
        them (a new token segment each), a group with no token yet is stamped with them, and under
        partial rollout every group in flight counts its lag from them (`TrainQueue.restamp`)."""
        if version > inst.version:
            for finish, s in inst.heap:
                self.segments[s].append((version, self.cur_end[s] - (finish - inst.step)))
            for g in sorted(inst.groups):
                started = self.group_started[g] > 0
                if not started or self.spec.partial_rollout:
                    self.queue.restamp(g, version, started=started, now=inst.t)
        inst.version = version

    def _count_token_lags(self, step: int, groups: list[QueuedGroup]) -> None:
        """Every token of the handout by its lag; a group's stamp must be its first token's version."""
        hist = self.token_lag_hist
        for qg in groups:
            g = qg.group_id
            first = min(self.segments[s][0][0] for s in range(g * self.n, (g + 1) * self.n))
            stamp = qg.version if qg.oldest_version is None else qg.oldest_version
            if first != stamp:
                raise AssertionError(f"group {g}: stamped with version {stamp}, first token at {first}")
            for s in range(g * self.n, (g + 1) * self.n):
                segs = self.segments.pop(s)
                for k, (v, lo) in enumerate(segs):
                    hi = segs[k + 1][1] if k + 1 < len(segs) else self.resp[s]
                    if hi > lo:
                        hist[step - v] = hist.get(step - v, 0) + hi - lo

    # ------------------------------------------------------------------------------------ trainer
    def _try_train(self, t: float) -> None:
        if self.trainer_busy:
            return
        h = self.queue.get(now=t)
        if h is None:
            if not self.spec.colocated and self.trainer_state != "wait":
                self._log_trainer(t, "wait")
            return
        self.log.queue(t, self.queue.n_queued, self.queue.n_in_flight)
        groups = [g.group_id for g in h.groups]
        self._count_token_lags(h.step, h.groups)
        if (
            self.spec.trainer_padded
        ):  # MindSpeed-RL deals the batch to DP ranks in data order, not finish order
            groups.sort()
        seq_tokens = (self.w.response_len[groups] + self.w.prompt_len[groups, None]).ravel()
        if self.mt:  # tool outputs are sequence tokens the trainer reads (loss-masked)
            seq_tokens = seq_tokens + self.tool_len[groups].ravel()
        self.samples_consumed += len(groups) * self.n
        self.tokens_consumed += h.tokens
        secs, useful = train_seconds(
            self.cost, seq_tokens, self.spec.trainer_devices, self.spec.trainer_padded
        )
        self.trainer_busy = True
        end_of_version = self.queue.consumed % self.spec.version_groups == 0
        if self.spec.colocated:
            for inst in self.inst:
                if inst.n and not self.spec.preempt:
                    raise AssertionError("colocated switch with sequences still running")
                if inst.n and inst.t < t:
                    self._suspend(inst, t)
            t = max(
                [t] + [inst.t for inst in self.inst]
            )  # every instance at a boundary (or done re-prefilling)
            for inst in self.inst:
                inst.t = t
                inst.lent = True
                inst.tag += 1  # its pending completion event is void until it resumes
                self._log_inst(inst, "lent")
            t1 = t + self.cost.to_train_s
            self._log_trainer(t, "paused")
            self._log_trainer(t1, "busy", useful)
            t2 = t1 + secs
            t3 = t2 + (self.cost.to_infer_s if end_of_version else 0.0)
            if t3 > t2:
                self._log_trainer(t2, "paused")
            self._push(t3, _TRAIN_END, -1, int(end_of_version))
        else:
            self._log_trainer(t, "busy", useful)
            self._push(t + secs, _TRAIN_END, -1, int(end_of_version))

    def _suspend(self, inst: _Instance, t: float) -> None:
        """Colocated preemption: keep the whole steps done by t; the partial step is lost (redone later)."""
        k = steps_to_reach(self.cost, t - inst.t, inst.n, inst.kv)
        if k and decode_seconds(self.cost, k, inst.n, inst.kv) > t - inst.t + 1e-12:
            k -= 1
        self._advance(inst, min(k, inst.heap[0][0] - inst.step))

    def _resume_cost(self, inst: _Instance) -> float:
        """Partial rollout resumes by re-prefilling prompt + generated tokens (verl/vLLM free the KV)."""
        return inst.kv * self.cost.prefill_s_per_token  # kv = prompt + generated tokens of the running ones

    def _train_end(self, t: float, end_of_version: bool) -> None:
        if end_of_version:
            self.version += 1
            self.log.version(t, self.version)
        if self.spec.colocated:
            self.trainer_busy = False
            self._log_trainer(t, "lent")
            self._mark_iteration(t)
            for inst in self.inst:
                inst.lent = False
                inst.t = t
                if inst.n:
                    self._log_inst(inst, "paused")
                    inst.t += self._resume_cost(inst)
                if end_of_version:
                    self._new_weights(inst, self.version)
                    inst.pending_version = self.version
                inst.logged = ()
            for inst in self.inst:
                self._fill(inst)
            self._try_train_colocated(t)
            return
        if end_of_version and self.cost.refresh_s > 0:
            self._log_trainer(t, "paused")
            for inst in self.inst:
                inst.pending_version = self.version
                self._wake(inst, t) if inst.n else self._wake_idle_refresh(inst, t)
            self._push(t + self.cost.refresh_s, _TRAINER_FREE)
            return
        if end_of_version:
            for inst in self.inst:
                self._new_weights(inst, self.version)
                inst.pending_version = self.version
        self._trainer_free(t)

    def _wake_idle_refresh(self, inst: _Instance, t: float) -> None:
        if inst.paused:
            return
        inst.t = max(inst.t, t)
        self._pause(inst)

    def _try_train_colocated(self, t: float) -> None:
        if self.queue.ready():
            self._try_train(t)

    def _trainer_free(self, t: float) -> None:
        self.trainer_busy = False
        self._mark_iteration(t)
        self.trainer_state = ""
        self._try_train(t)
        self._wake_all(t)

    def _mark_iteration(self, t: float) -> None:
        per_iter = self.w.prompts_per_iteration
        while (len(self.iteration_ends) + 1) * per_iter <= self.queue.consumed:
            self.iteration_ends.append(t)
            self.log.iteration(t)

    # --------------------------------------------------------------------------------------- run
    def run(self) -> RunResult:
        t0 = 0.0
        if self.spec.colocated:
            self._log_trainer(t0, "lent")
        else:
            self._log_trainer(t0, "wait")
        self.log.version(t0, 0)
        for inst in self.inst:
            self._fill(inst)
        events = self.events
        while events:
            t, _, kind, i, tag = heapq.heappop(events)
            if kind == _INST:
                inst = self.inst[i]
                if tag != inst.tag:
                    continue
                self._advance(inst, inst.target - inst.step)
                self._at_boundary(inst)
            elif kind == _REFRESH_DONE:
                inst = self.inst[i]
                if tag != inst.tag:
                    continue
                inst.paused = False
                self._new_weights(inst, inst.loading_version)
                inst.logged = ()
                self._at_boundary(inst)
            elif kind == _TRAIN_END:
                self._train_end(t, bool(tag))
            elif kind == _TRAINER_FREE:
                self._trainer_free(t)
            elif kind == _TOOL_DONE:
                self._tool_done(t, i, tag)
        total_groups = self.w.num_groups
        if self.queue.consumed != total_groups:
            raise RuntimeError(
                f"{self.spec.mode}: simulation stalled with {self.queue.consumed}/{total_groups} groups "
                "consumed "
                f"({self.queue.n_in_flight} in flight, {self.queue.n_queued} queued)"
            )
        end = self.iteration_ends[-1] if self.iteration_ends else 0.0
        # close every track at the end so the accounting spans the same window
        for inst in self.inst:
            inst.t = max(inst.t, end)
        self.log.meta.update({"mode": self.spec.mode, "t_end": end})
        return RunResult(
            self.spec,
            self.log,
            self.queue,
            self.iteration_ends,
            self.tokens,
            self.samples_consumed,
            self.tokens_consumed,
            end,
            list(self.queue.stats.lags),
            dict(sorted(self.token_lag_hist.items())),
        )
