"""Measure the local rollout engine for the simulator (`asp-npu calibrate`).

Why: the simulator's `cpu` preset must predict what the real CPU pipeline does, so its costs come
from this machine's vLLM engine, not from guesses. Measured on one engine pinned to one core,
exactly as a rollout instance runs:
- decode step time vs running batch and KV tokens -> least-squares fit `a + b*batch + c*kv_tokens`
  (each point: `ignore_eos` batches of B sequences run for T and for T/4 tokens; step = wall-time
  difference / token difference, which cancels prefill and per-request overheads; KV tokens = mean
  tokens held during the extra decode);
- prefill seconds per prompt token (time to first token of single fresh prompts, slope of a fit);
- weight_refresh seconds (the model's own weights, through the same path as training);
- the trainer (`asp_npu.trainer.calibrate`): wall seconds per token of `train_step` at the config's
  minibatch shape, placed as the config's asynchronous mode places it and as a colocated mode does;
- with `trainer`, the engine runs at the priority the config's asynchronous mode gives its instances
  (lowered where they share cores with the trainer), as it does in the run;
- core sharing: where rollout and training overlap (an asynchronous mode), each slows the other by
  what this machine does when they run together: engine 0's decode step at a fixed batch with the
  trainer idle vs stepping back to back, and a trainer step with the engines idle vs decoding, in
  the run's placement (the run's other instances decode throughout; engines niced where the run
  nices them), measured in interleaved pairs. The ratios are the simulator's slowdown factors.
- the host-side optimizer step (`asp_npu.trainer.calibrate.host_optimizer_s_per_param`): seconds per
  parameter of the Adam step megatron's HybridDeviceOptimizer runs on the host under
  `optimizer_cpu_offload`, what `check` and the layout search charge per offloaded parameter.
Prompts are random token ids, distinct per sequence, so prefix caching cannot shortcut anything.
This module measures; the simulator fits its cost model to the points and writes the `asp-calib/1`
file (asp_npu/sim/calibrate.py).
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asp_npu import interrupt
from asp_npu.config import Config
from asp_npu.device import DeviceKind
from asp_npu.rollout.engine import SamplingSettings
from asp_npu.types import PromptItem


def _random_prompt(rng: random.Random, n: int, lo: int, hi: int, tag: str) -> PromptItem:
    return PromptItem(
        f"calib-{tag}-{rng.random():.12f}", prompt_token_ids=[rng.randrange(lo, hi) for _ in range(n)]
    )


async def _batch(engine: Any, rng: random.Random, batch: int, prompt_len: int, tokens: int, lo: int, hi: int):
    import asyncio

    sampling = SamplingSettings(
        max_tokens=tokens, ignore_eos=True, temperature=1.0, seed=rng.randrange(1 << 30)
    )
    items = [_random_prompt(rng, prompt_len, lo, hi, f"d{batch}") for _ in range(batch)]
    groups = await asyncio.gather(*(engine.generate(it, sampling) for it in items))
    return [g[0] for g in groups]


async def _decode_step(engine: Any, rng: random.Random, batch: int, prompt_len: int, tokens: int,
                       lo: int, hi: int) -> float:
    """One decode step at `batch` running sequences: (wall(T) - wall(T/4)) / (3T/4) tokens."""
    short = max(2, tokens // 4)
    wall = {}
    for n in (short, tokens):
        t0 = time.time()
        await _batch(engine, rng, batch, prompt_len, n, lo, hi)
        wall[n] = time.time() - t0
    return max(1e-6, (wall[tokens] - wall[short]) / (tokens - short))


async def _keep_busy(engine: Any, rng: random.Random, batch: int, prompt_len: int, tokens: int,
                     lo: int, hi: int, stop: Any) -> None:
    """Decode batches of `batch` back to back until `stop` (an asyncio.Event) is set."""
    while not stop.is_set():
        await _batch(engine, rng, batch, prompt_len, tokens, lo, hi)


async def measure(
    engine: Any,
    batches: list[int],
    prompt_lens: list[int],
    decode_tokens: int,
    prefill_lens: list[int],
    repeats: int,
    refresh_weights: dict[str, Any] | None,
    seed: int = 0,
) -> dict[str, Any]:
    """Raw measurements (medians over `repeats`) of an engine that follows the RolloutEngine protocol."""
    rng = random.Random(seed)
    vocab = len(engine.tokenizer)
    lo, hi = min(16, vocab - 1), vocab  # skip the lowest ids, where tokenizers keep special tokens
    await _batch(engine, rng, 2, 16, 8, lo, hi)  # warm-up: the first generate of a process is slow
    decode = []
    short = max(2, decode_tokens // 4)
    for p in prompt_lens:
        for b in batches:
            steps = []
            for _ in range(repeats):
                wall = {}
                for n in (short, decode_tokens):
                    t0 = time.time()
                    await _batch(engine, rng, b, p, n, lo, hi)
                    wall[n] = time.time() - t0
                steps.append((wall[decode_tokens] - wall[short]) / (decode_tokens - short))
            decode.append(
                {
                    "batch": b,
                    "prompt_len": p,
                    "decode_tokens": [short, decode_tokens],
                    "step_s": max(1e-6, statistics.median(steps)),
                    "step_s_runs": [max(1e-6, x) for x in steps],
                    "kv_tokens": b * (p + (short + decode_tokens) / 2),
                }
            )
    prefill = []
    for p in prefill_lens:
        ttft = []
        for _ in range(repeats):
            prompt = _random_prompt(rng, p, lo, hi, "p")
            (t,) = await engine.generate(prompt, SamplingSettings(max_tokens=1, stream=True))
            ttft.append(t.t_first_token - t.t_submitted)
        prefill.append({"prompt_tokens": p, "ttft_s": statistics.median(ttft), "ttft_s_runs": ttft})
    refresh = []
    if refresh_weights is not None:
        for _ in range(repeats):
            rep = await engine.refresh_weights(refresh_weights, engine.policy_version + 1)
            refresh.append({"total_s": rep.total_s, "load_s": rep.load_s, "bytes": rep.num_bytes})
    return {"decode": decode, "prefill": prefill, "refresh": refresh}


@dataclass
class EngineMeasurement:
    """What one engine measured: raw points (decode, prefill, refresh) and how they were taken."""

    model: str
    points: dict[str, Any]
    meta: dict[str, Any]


def measure_engine(
    engine: Any,
    loop: Any,
    model: str,
    max_num_seqs: int,
    quick: bool = False,
    repeats: int = 3,
    meta: dict[str, Any] | None = None,
) -> EngineMeasurement:
    """Measure a running engine (driven through `loop`, a LoopThread) at batches up to `max_num_seqs`."""
    from safetensors.numpy import load_file

    batches = sorted(
        {b for b in ([1, 4, 16] if quick else [1, 2, 4, 8, 16, 32, 64]) if b <= max_num_seqs} | {max_num_seqs}
    )
    decode_tokens = 32 if quick else 96
    prompt_lens = [p for p in ([16, 128] if quick else [16, 256]) if p + decode_tokens < engine.max_model_len]
    prefill_lens = [p for p in ([32, 192] if quick else [32, 128, 512, 1024]) if p < engine.max_model_len - 1]
    weights: dict[str, Any] = {}
    for f in sorted(Path(model).glob("*.safetensors")):
        weights.update(load_file(str(f)))
    t0 = time.time()
    points = loop.run(
        measure(engine, batches, prompt_lens or [8], decode_tokens, prefill_lens or [8, 16], repeats, weights)
    )
    return EngineMeasurement(
        model=str(model),
        points=points,
        meta={
            **(meta or {}),
            "max_num_seqs": max_num_seqs,
            "repeats": repeats,
            "quick": quick,
            "measure_s": time.time() - t0,
            "loadavg_1m_after": os.getloadavg()[0],
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    )


def _placed(cfg: Config, kind: DeviceKind, mode: str) -> tuple[Config, Any, Any]:
    """A copy of `cfg` run as `mode`, that placement (`pipeline.fleet.Fleet` places without starting
    anything) and the trainer ranks' start in it (`RankStart`: the cores and threads the run gives them)."""
    from asp_npu.config import with_changes
    from asp_npu.core.modes import mode_spec
    from asp_npu.pipeline.fleet import Fleet

    c = with_changes(cfg, {"rl_config.mode": mode})
    fleet = Fleet(c, kind, mode_spec(mode, c.generate_config.admission))
    return c, fleet.placement, fleet.derived.rank_start()


class _Busy:
    """Engines decoding batches back to back on `loop` while the block runs."""

    def __init__(self, loop: Any, engines: list[Any], batch: int, tokens: int, seed: int) -> None:
        self.loop, self.engines, self.batch, self.tokens, self.seed = loop, engines, batch, tokens, seed
        self.futs: list[Any] = []

    def __enter__(self) -> _Busy:
        import asyncio

        async def make() -> asyncio.Event:
            return asyncio.Event()

        self.stop = self.loop.run(make())
        for k, e in enumerate(self.engines):
            vocab = len(e.tokenizer)
            rng = random.Random(self.seed + k)
            coro = _keep_busy(e, rng, self.batch, 16, self.tokens, min(16, vocab - 1), vocab, self.stop)
            self.futs.append(asyncio.run_coroutine_threadsafe(coro, self.loop.loop))
        time.sleep(0.5)  # running
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.loop.call_soon_threadsafe(self.stop.set)
        for f in self.futs:
            f.result(timeout=600)


def async_mode(cfg: Config) -> str:
    """The asynchronous mode whose placement the trainer and core sharing are measured in."""
    from asp_npu.core.modes import TABLE

    return cfg.rl_config.mode if not TABLE[cfg.rl_config.mode].colocated else "asp"


def _set_nice(value: int) -> bool:
    """This process's priority (children started later inherit it); False where not permitted."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, value)
        return True
    except OSError:
        return False


def _start_other_instances(acfg: Config, placement: Any, start: Any, kind: DeviceKind, settings: Any,
                           out: dict[str, Any]) -> list[Any]:
    """The run's instances beside engine 0 on their placed cores (none when rollout and trainer are
    disjoint), at the run's priority; records the placement in `out`."""
    import psutil  # type: ignore[import-untyped]

    from asp_npu.device import pin_process, rollout_env
    from asp_npu.rollout.vllm_engine import VLLMEngine

    extra: list[Any] = []
    if placement is None:
        return extra
    out["placement"] = {"disjoint": placement.disjoint, "instance_cores": placement.instance_cores,
                        "trainer_cores": list(start.cores) or placement.trainer_cores,
                        "trainer_threads": start.threads, "nice": placement.rollout_nice}
    for cores in ([] if placement.disjoint else placement.instance_cores[1:]):
        pin_process(list(cores))  # the engine's processes inherit it
        extra.append(VLLMEngine(settings, rollout_env(kind, list(cores), acfg.generate_config.kv_cache_gib)))
    if placement.rollout_nice:
        for p in psutil.Process().children(recursive=True):  # the engines' processes (before Ray)
            p.nice(placement.rollout_nice)
    return extra


def measure_sharing(
    cfg: Config, kind: DeviceKind, engine: Any, loop: Any, settings: Any, all_cores: list[int], repeats: int,
    quick: bool,
) -> dict[str, Any]:
    """The trainer's seconds per token (asynchronous and colocated placement) and the core-sharing
    slowdowns (module docstring). Engine 0 is `engine`; the run's other instances are built here."""
    from asp_npu.core.shape import trainer_world
    from asp_npu.device import pin_process
    from asp_npu.trainer.calibrate import BackgroundTrainer, batch_tokens, calibration_batch, timed_steps
    from asp_npu.trainer.group import TrainerGroup

    pin_process(all_cores)  # placement reads this process's cores, which engine 0 narrowed
    mode = async_mode(cfg)
    acfg, placement, start = _placed(cfg, kind, mode)
    gen = cfg.generate_config
    out: dict[str, Any] = {"mode": mode, "placement": None}
    extra = _start_other_instances(acfg, placement, start, kind, settings, out)
    pin_process(all_cores)  # Ray and the trainer ranks get the run's placement, not engine 0's cores
    _set_nice(0)  # nor engine 0's priority (measure_config lowered this process's for its engine)
    batch = calibration_batch(acfg)
    short = calibration_batch(acfg, length_scale=0.25)  # same samples, answers a quarter as long
    tokens, short_tokens = batch_tokens(batch), batch_tokens(short)
    world = trainer_world(acfg)
    d_tokens = 32 if quick else 64
    probe = _Probe(loop, engine, random.Random(7), max(1, gen.max_num_seqs // 2), d_tokens,
                   max(8, min(4 * d_tokens, engine.max_model_len - 20)))  # prompts are 16 tokens
    d_alone, d_shared, t_alone, t_shared = [], [], [], []
    group = TrainerGroup(acfg, start=start)
    if placement is not None and placement.disjoint:
        pin_process(list(placement.instance_cores[0]))  # engine 0 front-end (here) off the trainer cores
    try:
        timed_steps(group, batch, 2)  # warm-up
        for r in range(repeats + 1):
            with probe.busy(extra, 100 * r):
                d_alone.append(probe.decode())
                with BackgroundTrainer(group, batch):
                    d_shared.append(probe.decode())
            t_alone.append(statistics.median(timed_steps(group, batch, 2)))
            with probe.busy([engine, *extra], 100 * r + 50):
                t_shared.append(statistics.median(timed_steps(group, batch, 2)))
        t_short = timed_steps(group, short, max(3, repeats + 1))
    finally:
        group.shutdown()
        for e in extra:
            e.shutdown()
    co_alone, co_shared, c_steps, c_short, cworld, cthreads = _measure_colocated(
        cfg, kind, settings, all_cores, repeats, probe, batch, short
    )
    return {
        **out,
        "batch_samples": batch.num_samples,
        "batch_tokens": tokens,
        "short_batch_tokens": short_tokens,
        "trainer": _trainer_fit(t_alone, t_short, tokens, short_tokens, world, max(1, start.threads)),
        "trainer_colocated": _trainer_fit(c_steps, c_short, tokens, short_tokens, cworld, cthreads),
        "sharing": {"decode_batch": probe.batch, "decode_alone_s": d_alone, "decode_shared_s": d_shared,
                    "train_alone_s": t_alone, "train_shared_s": t_shared,
                    "colocated_decode_alone_s": co_alone, "colocated_decode_shared_s": co_shared},
    }


@dataclass
class _Probe:
    """Engine 0's timed decode step, and the load that keeps other engines decoding meanwhile."""

    loop: Any
    engine: Any
    rng: random.Random
    batch: int
    tokens: int
    busy_tokens: int

    def decode(self) -> Any:
        vocab = len(self.engine.tokenizer)
        return self.loop.run(_decode_step(self.engine, self.rng, self.batch, 16, self.tokens, 16, vocab))

    def busy(self, engines: list[Any], tag: int) -> _Busy:
        return _Busy(self.loop, engines, self.batch, self.busy_tokens, tag)


def _measure_colocated(
    cfg: Config, kind: DeviceKind, settings: Any, all_cores: list[int], repeats: int, probe: _Probe,
    batch: Any, short: Any,
) -> tuple[list[Any], list[Any], list[float], list[float], int, int]:
    """A colocated mode's numbers: engine 0's decode alone and with every colocated instance busy,
    and the trainer on every core (both batch shapes) while the instances sit idle, as in the run.
    Returns (decode alone, decode shared, long steps, short steps, trainer world, trainer threads)."""
    from asp_npu.core.shape import trainer_world
    from asp_npu.device import pin_process, rollout_env
    from asp_npu.rollout.vllm_engine import VLLMEngine
    from asp_npu.trainer.calibrate import timed_steps
    from asp_npu.trainer.group import TrainerGroup

    pin_process(all_cores)  # a colocated trainer is placed on every core, not on engine 0's
    ccfg, cplace, cstart = _placed(cfg, kind, "mindspeed-sync")
    co_extra: list[Any] = []
    co_alone, co_shared = [], []
    kv_gib = cfg.generate_config.kv_cache_gib
    try:
        for cores in (cplace.instance_cores[1:] if cplace is not None else []):
            pin_process(list(cores))  # a colocated mode's other instances, on their own cores
            co_extra.append(VLLMEngine(settings, rollout_env(kind, list(cores), kv_gib)))
        pin_process(all_cores)
        for r in range(repeats + 1 if co_extra else 0):  # engine 0 alone, then with every instance busy
            co_alone.append(probe.decode())
            with probe.busy(co_extra, 100 * r + 70):
                co_shared.append(probe.decode())
        group = TrainerGroup(ccfg, start=cstart)  # trains while the colocated instances idle, as in the run
        try:
            timed_steps(group, batch, 1)
            c_steps = timed_steps(group, batch, max(3, repeats + 1))
            c_short = timed_steps(group, short, max(3, repeats + 1))
        finally:
            group.shutdown()
    finally:
        for e in co_extra:
            e.shutdown()
    return co_alone, co_shared, c_steps, c_short, trainer_world(ccfg), max(1, cstart.threads)


def _trainer_fit(long_s: list[float], short_s: list[float], tokens: int, short_tokens: int, world: int,
                 threads: int) -> dict[str, Any]:
    """One placement's trainer: fixed wall seconds per step, and device-seconds per token (wall
    seconds per token x ranks x threads per rank: the simulator divides by the trainer's devices)."""
    from asp_npu.sim.calibrate import fit_step

    fixed, slope = fit_step(long_s, tokens, short_s, short_tokens)
    return {"step_s": long_s, "short_step_s": short_s, "wall_s_per_token": statistics.median(long_s) / tokens,
            "world": world, "threads": threads, "fixed_step_s": fixed,
            "device_s_per_token": slope * world * threads}


def measure_config(
    cfg: Config, quick: bool = False, repeats: int = 3, trainer: bool = True
) -> EngineMeasurement:
    """Build one engine from `cfg` (an asp_npu Config) on the first instance's devices (on CPU the
    whole process is confined to them, as a run's instance is), measure it; with `trainer`, then the
    trainer and core sharing (`measure_sharing`); shut everything down. Every probe is taken `repeats`
    times; other processes' CPU use is sampled throughout (`machine_load.ForeignLoad`, in `meta`), and
    one core's matmul FLOP/s is probed `max(3, repeats)` times (`points["matmul_flops_per_s"]`), the
    host-side Adam step of `optimizer_cpu_offload` `repeats` times (`points["host_optimizer_s_per_param"]`).

    The matmul probes are spread over the calibration -- before the engine's probes, between them and the
    trainer's, and at the end (the rest) -- so their spread is the machine's own speed drifting while it
    calibrates: on a shared host other tenants slow every core without any process here to see
    (measured: 84-106 GFLOP/s over three calibrations in 20 minutes, each quiet by `ForeignLoad`)."""
    from asp_npu.pipeline.machine_load import ForeignLoad

    with ForeignLoad() as load:
        mm = _matmul_probes(1, quick)  # start
        m = _measure_config(cfg, quick, repeats, trainer, between=lambda: mm.extend(_matmul_probes(1, quick)))
        mm += _matmul_probes(max(1, repeats - 2), quick)  # end
        m.points["matmul_flops_per_s"] = mm
        m.points["host_optimizer_s_per_param"] = _host_optimizer_probes(repeats, quick)
    m.meta["foreign_load"] = load.summary()
    return m


def _matmul_probes(repeats: int, quick: bool) -> list[float]:
    from asp_npu.trainer.calibrate import matmul_flops_per_s

    return [matmul_flops_per_s(min_s=0.2 if quick else 0.5) for _ in range(repeats)]


def _host_optimizer_probes(repeats: int, quick: bool) -> list[float]:
    from asp_npu.trainer.calibrate import HOST_OPTIMIZER_PARAMS, host_optimizer_s_per_param

    params = HOST_OPTIMIZER_PARAMS // 2 if quick else HOST_OPTIMIZER_PARAMS
    return [host_optimizer_s_per_param(params, min_s=0.2 if quick else 0.5) for _ in range(repeats)]


def _measure_config(cfg: Config, quick: bool, repeats: int, trainer: bool,
                    between: Callable[[], Any] = lambda: None) -> EngineMeasurement:
    from asp_npu.data.init_model import build_model_dir, check_model_dir
    from asp_npu.device import confine_to_devices, detect, rollout_env
    from asp_npu.rollout.engine import EngineSettings, LoopThread
    from asp_npu.rollout.vllm_engine import VLLMEngine

    model = Path(cfg.model.path)
    if not model.exists() and cfg.model.build_if_missing:
        build_model_dir(model, cfg.model.size, arch=cfg.model.architecture)
    check_model_dir(model)
    gen = cfg.generate_config
    kind = detect(cfg.trainer.device)
    all_cores = sorted(os.sched_getaffinity(0))
    settings = EngineSettings(
        str(model),
        dtype=cfg.model.dtype,
        max_num_seqs=gen.max_num_seqs,
        max_num_batched_tokens=gen.max_num_batched_tokens,
        enforce_eager=gen.enforce_eager,
        max_model_len=getattr(gen, "max_model_len", 0) or None,
    )
    print(f"calibrate: config and model {model} checked; starting the engine", file=sys.stderr, flush=True)
    loop = LoopThread()
    engine = None
    try:

        # an instance of a placement that shares cores runs at a lower priority: so does this one
        placement = _placed(cfg, kind, async_mode(cfg))[1] if trainer else None
        nice = placement.rollout_nice if placement is not None else 0

        async def build() -> VLLMEngine:
            devices = list(range(gen.infer_tensor_parallel_size))
            confine_to_devices(kind, devices)  # the engine's processes inherit it
            if nice:
                os.nice(nice)
            return VLLMEngine(settings, rollout_env(kind, devices, gen.kv_cache_gib))

        engine = loop.run(build())
        meta = {"device": kind, "dtype": cfg.model.dtype, "engine_nice": nice}
        m = measure_engine(engine, loop, str(cfg.model.path), gen.max_num_seqs, quick, repeats, meta)
        between()
        if trainer:
            t0 = time.time()
            m.points["trainer"] = measure_sharing(
                cfg, kind, engine, loop, settings, all_cores, repeats, quick
            )
            m.meta["trainer_measure_s"] = time.time() - t0
            m.meta["loadavg_1m_after_trainer"] = os.getloadavg()[0]
        return m
    finally:
        if engine is not None:
            engine.shutdown()
        loop.close(1.0 if interrupt.received() else 10.0)  # a signal: the command ends the engine's processes
