"""`RolloutInstance`: a Ray actor owning one engine, executing its part of a RolloutPlan.

Units arrive through `submit_units` (the whole plan at once, or paced by the controller's admission
control) and run in order. `admission="unit"` runs a unit as one batch and starts the next when it
ends (the planner's cost model; padding bubbles are what a unit's tail leaves idle);
`admission="continuous"` starts each group of the next unit as soon as its samples fit in the free
slots (vLLM's continuous batching: a finished sample frees its slot; units keep their order).
Each GRPO group is streamed out the moment its last sample finishes — to a sink actor's
`put_group(list[Trajectory])` and/or to `poll()` — not at the end of the plan.

For bubble accounting the instance reports busy intervals (at least one sequence running),
per-sequence start/finish events and per-unit start/finish events, all on the wall clock
(`time.time()`), so intervals of different instances compare directly.

`refresh_weights(weights, version, drain)` is a weight_refresh: the HF-named state dict
(safetensors bytes or a numpy dict) loads in place, either after running sequences finish on the old
weights (drain) or between two engine steps while they keep decoding (in flight; see vllm_engine).
`pause()` / `resume()` serve the synchronous colocated baselines: admission stops, and on NPU/CUDA
the engine sleeps (vLLM sleep mode frees weights and KV memory); vLLM's CPU backend has no sleep
mode, so on CPU the memory stays allocated.

Placement: `launch_instances` gives each instance its own devices through `asp_npu.device`
(a CPU core via `VLLM_CPU_OMP_THREADS_BIND` and an explicit `VLLM_CPU_KVCACHE_SPACE`; on NPU a
`{"NPU": n}` Ray resource and `ASCEND_RT_VISIBLE_DEVICES`).
"""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from asp_npu.errors import UserError
from asp_npu.rollout.engine import EngineSettings, SamplingSettings
from asp_npu.rollout.multi_turn import generate_one
from asp_npu.types import PromptItem, Trajectory

ADMISSION = ("unit", "continuous")
BASELINE_IDX = -1  # the sample index ReMax's greedy baseline request runs under (no sample has it)


def with_baseline(trajs: list[Trajectory], baseline: list[Trajectory]) -> list[Trajectory]:
    """The group's samples, each carrying the greedy baseline's reward and length (if there is one)."""
    for b in baseline:
        for t in trajs:
            t.reward_baseline, t.baseline_len = b.reward, b.response_len
    return trajs


@dataclass(frozen=True)
class UnitSpec:
    """What an instance needs of a DispatchUnit (plan objects and `asp-plan/1` dicts both convert)."""

    unit: int
    samples: tuple[tuple[str, int], ...]  # (prompt_id, sample_idx)
    target_step: int = -1

    @classmethod
    def of(cls, u: Any) -> UnitSpec:
        if isinstance(u, UnitSpec):
            return u
        if isinstance(u, Mapping):
            samples = tuple((str(s["prompt_id"]), int(s["sample_idx"])) for s in u["samples"])
            return cls(int(u["unit"]), samples, int(u.get("target_step", -1)))
        samples = tuple((str(s.prompt_id), int(s.sample_idx)) for s in u.samples)
        return cls(int(u.unit), samples, int(getattr(u, "target_step", -1)))

    def groups(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for pid, idx in self.samples:
            out.setdefault(pid, []).append(idx)
        return out


class RolloutInstance:
    """Wrap with `ray.remote` (see `launch_instances`); every public method is a coroutine."""

    def __init__(
        self,
        instance_id: int,
        settings: EngineSettings,
        sampling: SamplingSettings,
        env: Mapping[str, str] | None = None,
        sink: Any = None,
        admission: str = "unit",
        keep_polled: bool = True,
    ) -> None:
        if admission not in ADMISSION:
            raise UserError(f"admission '{admission}' is not one of {', '.join(ADMISSION)}")
        self.instance_id = instance_id
        self.settings = settings
        self.sampling = sampling
        self.env = dict(env or {})
        self.sink = sink
        self.admission = admission
        self.keep_polled = keep_polled  # False when only a sink consumes groups
        self.engine: Any = None
        self.prompts: dict[str, PromptItem] = {}
        self._queue: deque[tuple[UnitSpec, SamplingSettings]] = deque()
        self._queue_changed: asyncio.Event | None = None
        self._slots_freed: asyncio.Event | None = None  # set whenever a group gives its slots back
        self._expected: dict[str, int] = {}
        self._partial: dict[str, list[Trajectory]] = {}
        self._ready: list[list[Trajectory]] = []
        self._running_units: set[asyncio.Task] = set()
        self._slots_used = 0  # samples of started units not finished yet (admission's view of slots)
        self._runner: asyncio.Task | None = None
        self._sink_calls: list[Any] = []
        self.unit_events: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []
        self.groups_delivered = 0
        self.tokens_generated = 0
        self.baseline_tokens = 0  # ReMax's greedy baseline responses (not samples, not in tokens_generated)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> dict[str, Any]:
        """Build the engine (in this process, with this instance's env) and start the unit runner."""
        from asp_npu.device import PIN_CORES_ENV, ROLLOUT_NICE_ENV, pin_process
        from asp_npu.rollout.vllm_engine import VLLMEngine

        t0 = time.time()
        os.environ.update(self.env)
        # before the engine starts: its EngineCore and worker processes inherit priority and cores
        nice = int(self.env.get(ROLLOUT_NICE_ENV, "0"))
        if nice:
            os.nice(nice)
        if self.env.get(PIN_CORES_ENV):
            pin_process([int(c) for c in self.env[PIN_CORES_ENV].split(",")])
        self.attach_engine(VLLMEngine(self.settings, self.env))
        return {
            "instance": self.instance_id,
            "pid": os.getpid(),
            "startup_s": time.time() - t0,
            "max_model_len": self.engine.max_model_len,
            "sleep_supported": self.engine.sleep_supported,
            "env": {
                k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "ASCEND_", "CUDA_VISIBLE"))
            },
        }

    def attach_engine(self, engine: Any) -> None:
        """Use an already built engine (any `RolloutEngine`) and start the unit runner."""
        self.engine = engine
        self._queue_changed = asyncio.Event()
        self._slots_freed = asyncio.Event()
        self._runner = asyncio.get_running_loop().create_task(self._run())

    async def worker_cpu_affinity(self) -> list[int]:
        return await self.engine.worker_cpu_affinity()

    async def shutdown(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
        for t in list(self._running_units):
            t.cancel()
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None

    async def ping(self) -> int:
        return self.instance_id

    # -- work in -----------------------------------------------------------------------------

    async def add_prompts(self, items: Iterable[PromptItem]) -> int:
        for it in items:
            self.prompts[it.prompt_id] = it
        return len(self.prompts)

    async def submit_units(self, units: Iterable[Any], sampling: SamplingSettings | None = None) -> int:
        """Queue units (DispatchUnit, `asp-plan/1` dict or UnitSpec) behind those already queued.

        Returns how many units are queued (not yet started) afterwards.
        """
        specs = [UnitSpec.of(u) for u in units]
        for spec in specs:
            for pid, idxs in spec.groups().items():
                self._expected[pid] = self._expected.get(pid, 0) + len(idxs)
            self._queue.append((spec, sampling or self.sampling))
        self._notify()
        return len(self._queue)

    async def generate_items(self, items: Iterable[PromptItem],
                             sampling: SamplingSettings) -> list[Trajectory]:
        """Generate `items` now, beside the planned work and outside the TrainQueue (validation on a
        held-out set): every sample of every item, scored by the engine's reward function."""
        mt = self.settings.multi_turn
        if mt is not None:
            return list(await asyncio.gather(*(generate_one(self.engine, it, replace(sampling, n=1), i, mt)
                                               for it in items for i in range(sampling.n))))
        groups = await asyncio.gather(*(self.engine.generate(it, sampling) for it in items))
        return [t for g in groups for t in g]

    async def run_plan(
        self,
        units: Iterable[Any],
        prompts: Iterable[PromptItem] | None = None,
        sampling: SamplingSettings | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Submit all units and wait until they are done; returns `stats()`."""
        if prompts is not None:
            await self.add_prompts(prompts)
        await self.submit_units(units, sampling)
        await self.wait_idle(timeout)
        return await self.stats()

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """True once no unit is queued or running (False on timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._queue or self._running_units:
            if deadline is not None and time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)
        if self._sink_calls:
            await asyncio.gather(*self._sink_calls, return_exceptions=True)
            self._sink_calls.clear()
        return True

    def _notify(self) -> None:
        if self._queue_changed is not None:
            self._queue_changed.set()

    # -- execution ---------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._queue_changed is not None and self._slots_freed is not None
        while True:
            if not self._queue:
                self._queue_changed.clear()
                await self._queue_changed.wait()
                continue
            spec, sampling = self._queue[0]
            if self.admission == "unit":
                while self._running_units:
                    await asyncio.wait(set(self._running_units))
            else:
                await self._room(len(next(iter(spec.groups().values()), [])))
            await self._admitting()
            self._queue.popleft()
            admitted = asyncio.Event()
            task = asyncio.get_running_loop().create_task(self._run_unit(spec, sampling, admitted))
            self._running_units.add(task)
            task.add_done_callback(self._running_units.discard)
            await admitted.wait()  # the unit's groups are all running before the next unit's may start

    async def _room(self, k: int) -> None:
        """Wait until `k` more sequences fit in the free slots (or nothing runs: a group larger
        than the instance still runs alone)."""
        assert self._slots_freed is not None
        while self._slots_used > 0 and self._slots_used + k > self.settings.max_num_seqs:
            self._slots_freed.clear()  # no await between the check and the wait: no lost wake-up
            await self._slots_freed.wait()

    async def _admitting(self) -> None:
        wait_admitting = getattr(self.engine, "wait_admitting", None)
        if wait_admitting is not None:  # nothing starts while paused or refreshing weights
            await wait_admitting()

    async def _run_unit(self, spec: UnitSpec, sampling: SamplingSettings, admitted: asyncio.Event) -> None:
        """Start the unit's groups (under continuous admission each once its slots are free), then
        wait for them; `admitted` is set once every group runs."""
        self.unit_events.append(
            {
                "event": "unit_start",
                "t": time.time(),
                "unit": spec.unit,
                "samples": len(spec.samples),
                "target_step": spec.target_step,
            }
        )
        loop = asyncio.get_running_loop()
        groups = []
        try:
            for k, (pid, idxs) in enumerate(spec.groups().items()):
                if k and self.admission != "unit":
                    await self._room(len(idxs))
                    await self._admitting()
                self._slots_used += len(idxs)
                groups.append(loop.create_task(self._run_group(spec.unit, pid, idxs, sampling)))
        finally:
            admitted.set()
        released = await asyncio.gather(*groups)
        # the unit ends when its last slot is released: with continuous admission the next unit may
        # start in that same instant, before this coroutine resumes
        t_end = max(released, default=time.time())
        self.unit_events.append({"event": "unit_finish", "t": t_end, "unit": spec.unit})

    def _release(self, k: int) -> float:
        """Give `k` sequence slots back to admission (a finished sample no longer runs in vLLM);
        returns the time, taken before a waiting unit can start in the slots."""
        t = time.time()
        self._slots_used -= k
        if self._slots_freed is not None:
            self._slots_freed.set()
        return t

    async def _run_group(self, unit: int, pid: str, idxs: list[int], sampling: SamplingSettings) -> float:
        """Generate one group and deliver it when whole; returns when its last slot was released.

        Each sample gives its slot back as it finishes, as vLLM frees its sequence, so a group whose
        long sample still decodes holds one slot, not `len(idxs)`."""
        item = self.prompts.get(pid)
        held, released = len(idxs), time.time()

        def done_one() -> None:
            nonlocal held, released
            if held > 0:
                held -= 1
                released = self._release(1)

        try:
            trajs = await self._generate_group(unit, pid, item, idxs, sampling, done_one)
        finally:
            if held:
                released = self._release(held)
                held = 0
        if trajs is None:
            return released
        for t in trajs:
            t.instance = self.instance_id
            self.tokens_generated += t.response_len
        got = self._partial.setdefault(pid, [])
        got.extend(trajs)
        if len(got) >= self._expected.get(pid, 0):
            self._expected.pop(pid, None)
            group = sorted(self._partial.pop(pid), key=lambda t: t.sample_idx)
            self._deliver(group)
        return released

    async def _generate_group(
        self, unit: int, pid: str, item: PromptItem | None, idxs: list[int], sampling: SamplingSettings,
        done_one: Callable[[], None],
    ) -> list[Trajectory] | None:
        """The group's samples (`done_one()` as each finishes), or None after recording why it failed
        (one bad prompt must not stop us)."""
        try:
            if item is None:
                raise UserError(
                    f"prompt '{pid}' of unit {unit} was never given to instance {self.instance_id}"
                )
            one = replace(sampling, n=1)

            async def sample(i: int) -> Trajectory:
                try:
                    if self.settings.multi_turn is not None:  # waiting on a tool, it holds no slot
                        return await generate_one(self.engine, item, one, i, self.settings.multi_turn,
                                                  self._slot_out, self._slot_in)
                    return (await self.engine.generate(item, one, [i]))[0]
                finally:
                    done_one()

            extra = [self._greedy_baseline(item, sampling)] if sampling.greedy_baseline else []
            out = list(await asyncio.gather(*(sample(i) for i in idxs), *extra))
            return with_baseline(out[:len(idxs)], out[len(idxs):])
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            msg = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
            self.errors.append(
                {
                    "t": time.time(),
                    "unit": unit,
                    "prompt_id": pid,
                    "sample_idxs": idxs,
                    "error": msg,
                    "user_error": isinstance(exc, UserError),
                    "trace": "" if isinstance(exc, UserError) else traceback.format_exc(),
                }
            )
            self._expected.pop(pid, None)
            self._partial.pop(pid, None)
            failed = getattr(self.sink, "group_failed", None)  # a queue actor sink retries the group
            if failed is not None:
                self._sink_calls.append(failed.remote(pid, self.instance_id, msg))
            return None

    async def _slot_out(self) -> None:
        """A multi-turn sample waits on a tool: its slot goes back to admission."""
        self._release(1)

    async def _slot_in(self) -> None:
        await self._room(1)
        self._slots_used += 1

    async def _greedy_baseline(self, item: PromptItem, sampling: SamplingSettings) -> Trajectory:
        """ReMax's baseline of a group: one greedy (temperature 0) response to its prompt, scored by the
        engine's reward function like the samples; not a sample (index BASELINE_IDX, never delivered),
        its tokens counted in `baseline_tokens`."""
        greedy = replace(sampling, n=1, temperature=0.0, top_p=1.0, seed=None, stream=False)
        (b,) = await self.engine.generate(item, greedy, [BASELINE_IDX])
        self.baseline_tokens += b.response_len
        return b

    def _deliver(self, group: list[Trajectory]) -> None:
        self.groups_delivered += 1
        if self.keep_polled or self.sink is None:
            self._ready.append(group)
        if self.sink is not None:
            self._sink_calls.append(self.sink.put_group.remote(group))
            if len(self._sink_calls) > 256:
                self._sink_calls = self._sink_calls[-64:]

    # -- results out -------------------------------------------------------------------------

    async def poll(self, max_groups: int | None = None) -> list[list[Trajectory]]:
        """Finished groups not yet taken, oldest first."""
        n = len(self._ready) if max_groups is None else min(max_groups, len(self._ready))
        out, self._ready = self._ready[:n], self._ready[n:]
        return out

    async def stats(self, since_event: int = 0) -> dict[str, Any]:
        """Accounting snapshot: busy intervals, sequence and unit events (from `since_event` on)."""
        act = self.engine.activity if self.engine is not None else None
        return {
            "instance": self.instance_id,
            "policy_version": self.engine.policy_version if self.engine is not None else -1,
            "busy_intervals": act.busy_intervals() if act else [],
            "sequence_events": act.events[since_event:] if act else [],
            "unit_events": list(self.unit_events),
            "in_flight": act.in_flight if act else 0,
            "queued_units": len(self._queue),
            "running_units": len(self._running_units),
            "groups_delivered": self.groups_delivered,
            "tokens_generated": self.tokens_generated,
            "baseline_tokens": self.baseline_tokens,
            "errors": list(self.errors),
            "paused": bool(self.engine is not None and self.engine.paused),
        }

    # -- weights / pause ---------------------------------------------------------------------

    async def refresh_weights(
        self, weights: bytes | Mapping[str, Any], version: int, drain: bool = True
    ) -> dict[str, Any]:
        """weight_refresh (drained or in flight, see `VLLMEngine.refresh_weights`)."""
        report = await self.engine.refresh_weights(weights, version, drain)
        self._restamp(version)
        return {"instance": self.instance_id, **asdict(report)}

    def _restamp(self, version: int) -> None:
        """Weights `version` are live: tell the sink which of this instance's groups start with them
        (no token yet, queued here or not scheduled by vLLM: `waiting`) and which keep decoding with
        them (`running`), so the lag ledger counts from the versions their tokens really have."""
        restamp = getattr(self.sink, "restamp", None)
        if restamp is None:
            return
        status = dict(getattr(self.engine, "last_refresh", None) or {})
        waiting = [pid for pid in self._expected
                   if pid not in self._partial and status.get(pid, "waiting") == "waiting"]
        running = [pid for pid, st in status.items() if st == "running"]
        if waiting or running:
            self._sink_calls.append(restamp.remote(self.instance_id, int(version), waiting, running))

    # vLLM's weight-transfer protocol, driven by the trainer's rank 0 (see `asp_npu.weights.engine_link`)

    async def transfer_world_size(self) -> int:
        return self.engine.transfer_world_size

    async def init_weight_transfer(self, init_info: Mapping[str, Any]) -> None:
        await self.engine.init_weight_transfer(init_info)

    async def start_weight_update(self, drain: bool = True) -> float:
        return await self.engine.start_weight_update(drain)

    async def update_weights(self, update_info: Any) -> None:
        """Receive one refresh; a broken transfer is one line naming this instance, and admission reopens."""
        try:
            await self.engine.update_weights(update_info)
        except UserError:
            raise
        except Exception as exc:
            await self.engine.abort_weight_update()
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            msg = f"rollout instance {self.instance_id}: weight transfer broke off: {first}"
            raise UserError(msg) from None

    async def finish_weight_update(self, version: int) -> dict[str, Any]:
        report = await self.engine.finish_weight_update(version)
        self._restamp(version)
        return {"instance": self.instance_id, **asdict(report)}

    async def pause(self) -> None:
        """Synchronous colocated baseline: stop generating (and free device memory where supported)."""
        await self.engine.pause()

    async def resume(self) -> None:
        await self.engine.resume()


class CollectingSink:
    """A minimal group sink (tests, benchmarks): stores groups with their arrival time."""

    def __init__(self) -> None:
        self.groups: list[tuple[float, list[Trajectory]]] = []

    def put_group(self, group: list[Trajectory]) -> int:
        self.groups.append((time.time(), group))
        return len(self.groups)

    def get(self) -> list[tuple[float, list[Trajectory]]]:
        return list(self.groups)


def instance_devices(index: int, devices_per_instance: int, devices_per_node: int) -> list[int]:
    """Local device ids of instance `index` when instances are packed onto nodes in order."""
    if devices_per_instance > devices_per_node:
        raise UserError(f"an instance needs {devices_per_instance} devices but a node has {devices_per_node}")
    per_node = devices_per_node // devices_per_instance
    first = (index % per_node) * devices_per_instance
    return list(range(first, first + devices_per_instance))


def instance_placement(
    kind: str, index: int, devices_per_instance: int, devices_per_node: int, kv_cache_gib: float,
    devices: list[int] | tuple[int, ...] | None = None,
) -> tuple[dict[str, str], dict[str, Any]]:
    """Environment and Ray actor options that pin instance `index` to its own devices.

    CPU: `num_cpus` cores and `VLLM_CPU_OMP_THREADS_BIND`; NPU/CUDA: the device resource
    (`{"NPU": n}`) and the visible-devices variable. The device-specific parts come from
    `asp_npu.device`. Single-machine CPU runs also need `device.loopback_env()` in the driver's
    environment before `ray.init` (actors inherit it). `devices` overrides the packed order (a CPU
    placement's cores).
    """
    from asp_npu.device import rollout_env, spec

    if devices is None:
        devices = instance_devices(index, devices_per_instance, devices_per_node)
    env = rollout_env(kind, list(devices), kv_cache_gib)  # type: ignore[arg-type]
    options: dict[str, Any] = {"runtime_env": {"env_vars": env}, "max_concurrency": 1000}
    resource = spec(kind).ray_resource  # type: ignore[arg-type]
    if resource is None:
        options["num_cpus"] = devices_per_instance
    else:
        options["num_cpus"] = 1
        options["resources"] = {resource: devices_per_instance}
    return env, options


START_S = 600.0  # an engine must be up within this (model load, KV cache, first-process imports)


def wait_started(actors: list[Any], refs: list[Any], timeout_s: float = START_S) -> None:
    """Wait for the `start` calls `refs` of `actors`: the first failure, or an engine not up within
    `timeout_s`, is one UserError naming the instance, and every one of them is killed."""
    from asp_npu.remote import get, kill_quietly

    try:
        get(refs, timeout_s, [f"rollout instance {i}" for i in range(len(actors))], "engine start")
    except Exception as exc:
        for a in actors:
            kill_quietly(a)
        cause: BaseException = exc
        while getattr(cause, "cause", None) is not None:
            cause = cause.cause  # type: ignore[attr-defined]
        raise UserError(f"starting rollout instances failed: {str(cause).splitlines()[0]}") from None


def launch_instances(
    num: int,
    settings: EngineSettings,
    sampling: SamplingSettings,
    kind: str = "cpu",
    kv_cache_gib: float = 1.0,
    devices_per_instance: int = 1,
    devices_per_node: int | None = None,
    sink: Any = None,
    admission: str = "unit",
    keep_polled: bool = True,
    start: bool = True,
    placement: Any = None,
    options_for: Any = None,
) -> list[Any]:
    """Create `num` RolloutInstance actors, each pinned to its own devices; Ray must be initialised.

    With `start`, the engines are built in parallel and this returns once all are ready
    (`wait_started`). Without, the caller calls `start` on each and passes the calls to `wait_started`
    once it has done what can overlap them (the pipeline forms its trainer group meanwhile).
    A `device.CpuPlacement` gives each instance its cores, pins the instance's whole process tree to
    them when the placement is disjoint, and lowers the engines' priority where it says so.
    """
    import ray

    from asp_npu.data.init_model import check_model_dir
    from asp_npu.device import PIN_CORES_ENV, ROLLOUT_NICE_ENV, available_devices

    check_model_dir(settings.model_path)
    per_node = devices_per_node or available_devices(kind)  # type: ignore[arg-type]
    actors = []
    for i in range(num):
        cores = placement.instance_cores[i] if placement is not None else None
        env, options = instance_placement(kind, i, devices_per_instance, per_node, kv_cache_gib, cores)
        if placement is not None and placement.rollout_nice:
            env = {**env, ROLLOUT_NICE_ENV: str(placement.rollout_nice)}
        if placement is not None and placement.disjoint:
            env = {**env, PIN_CORES_ENV: ",".join(str(c) for c in placement.instance_cores[i])}
        if options_for is not None:  # e.g. the instance's placement group (`pipeline.placement`)
            options = options_for(i, options)
        actor_cls = ray.remote(RolloutInstance).options(**options)
        actors.append(actor_cls.remote(i, settings, sampling, env, sink, admission, keep_polled))
    if start:
        wait_started(actors, [a.start.remote() for a in actors])
    return actors
