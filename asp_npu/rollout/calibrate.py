"""Measure the local rollout engine for the simulator (`asp-npu calibrate`).

Why: the simulator's `cpu` preset must predict what the real CPU pipeline does, so its costs come
from this machine's vLLM engine, not from guesses. Measured on one engine pinned to one core,
exactly as a rollout instance runs:
- decode step time vs running batch and KV tokens -> least-squares fit `a + b*batch + c*kv_tokens`
  (each point: `ignore_eos` batches of B sequences run for T and for T/4 tokens; step = wall-time
  difference / token difference, which cancels prefill and per-request overheads; KV tokens = mean
  tokens held during the extra decode);
- prefill seconds per prompt token (time to first token of single fresh prompts, slope of a fit);
- weight_refresh seconds (the model's own weights, through the same path as training).
Prompts are random token ids, distinct per sequence, so prefix caching cannot shortcut anything.
This module measures; the simulator fits its cost model to the points and writes the `asp-calib/1`
file (asp_npu/sim/calibrate.py).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asp_npu.config import Config
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
        prefill.append({"prompt_tokens": p, "ttft_s": statistics.median(ttft)})
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
    repeats: int = 2,
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


def measure_config(cfg: Config, quick: bool = False, repeats: int = 2) -> EngineMeasurement:
    """Build one engine from `cfg` (an asp_npu Config) on the first instance's devices (on CPU the
    whole process is confined to them, as a run's instance is), measure it, shut it down."""
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
    settings = EngineSettings(
        str(model),
        dtype=cfg.model.dtype,
        max_num_seqs=gen.max_num_seqs,
        max_num_batched_tokens=gen.max_num_batched_tokens,
        enforce_eager=gen.enforce_eager,
        max_model_len=getattr(gen, "max_model_len", 0) or None,
    )
    loop = LoopThread()
    engine = None
    try:

        async def build() -> VLLMEngine:
            devices = list(range(gen.infer_tensor_parallel_size))
            confine_to_devices(kind, devices)  # the engine's processes inherit it
            return VLLMEngine(settings, rollout_env(kind, devices, gen.kv_cache_gib))

        engine = loop.run(build())
        meta = {"device": kind, "dtype": cfg.model.dtype}
        return measure_engine(engine, loop, str(cfg.model.path), gen.max_num_seqs, quick, repeats, meta)
    finally:
        if engine is not None:
            engine.shutdown()
        loop.close()
