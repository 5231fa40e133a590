"""`asp-npu calibrate --config FILE --out calib.json`: measure the local engine for the simulator.

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
Output schema `asp-calib/1`; `trainer_s_per_token` is null here (the trainer is measured elsewhere).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from asp_npu.errors import UserError
from asp_npu.rollout.engine import SamplingSettings
from asp_npu.types import PromptItem

SCHEMA = "asp-calib/1"


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


def fit(points: dict[str, Any]) -> dict[str, Any]:
    """Least-squares cost fit; negative coefficients (noise) are dropped and the rest refitted."""
    import numpy as np

    d = points["decode"]
    y = np.array([p["step_s"] for p in d])
    cols = {
        "a": np.ones(len(d)),
        "b_per_seq": np.array([p["batch"] for p in d], float),
        "c_per_kv_token": np.array([p["kv_tokens"] for p in d], float),
    }
    keep = list(cols)
    coef: dict[str, float] = {}
    while keep:
        x = np.stack([cols[k] for k in keep], axis=1)
        sol, *_ = np.linalg.lstsq(x, y, rcond=None)
        coef = dict(zip(keep, sol.tolist(), strict=True))
        neg = [k for k in keep if coef[k] < 0 and k != "a"]
        if not neg:
            break
        keep.remove(min(neg, key=lambda k: coef[k]))
    step = {k: max(0.0, float(coef.get(k, 0.0))) for k in cols}
    pf = points["prefill"]
    prefill = None
    if len(pf) >= 2:
        xs = np.array([p["prompt_tokens"] for p in pf], float)
        slope = float(np.polyfit(xs, np.array([p["ttft_s"] for p in pf]), 1)[0])
        prefill = max(0.0, slope)
    refresh = statistics.median([r["total_s"] for r in points["refresh"]]) if points["refresh"] else None
    pred = (
        cols["a"] * step["a"]
        + cols["b_per_seq"] * step["b_per_seq"]
        + cols["c_per_kv_token"] * step["c_per_kv_token"]
    )
    rel_err = float(np.median(np.abs(pred - y) / y)) if len(y) else None
    return {
        "decode_step_s": step,
        "prefill_s_per_token": prefill,
        "refresh_s": refresh,
        "fit_median_rel_err": rel_err,
    }


def calibrate_engine(
    engine: Any,
    loop: Any,
    model: str,
    max_num_seqs: int,
    quick: bool = False,
    repeats: int = 2,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Measure a running engine (driven through `loop`, a LoopThread); return the `asp-calib/1` dict."""
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
    fitted = fit(points)
    return {
        "schema": SCHEMA,
        "model": str(model),
        "decode_step_s": fitted["decode_step_s"],
        "prefill_s_per_token": fitted["prefill_s_per_token"],
        "refresh_s": fitted["refresh_s"],
        "trainer_s_per_token": None,
        "points": points,
        "meta": {
            **(meta or {}),
            "max_num_seqs": max_num_seqs,
            "repeats": repeats,
            "quick": quick,
            "fit_median_rel_err": fitted["fit_median_rel_err"],
            "measure_s": time.time() - t0,
            "loadavg_1m_after": os.getloadavg()[0],
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    }


def calibrate(cfg: Any, quick: bool = False, repeats: int = 2) -> dict[str, Any]:
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
        return calibrate_engine(engine, loop, str(cfg.model.path), gen.max_num_seqs, quick, repeats, meta)
    finally:
        if engine is not None:
            engine.shutdown()
        loop.close()


def main(argv: list[str]) -> int:
    from asp_npu.cli import command_parser
    from asp_npu.config import load_config
    from asp_npu.io import atomic_write_json, check_writable

    parser = command_parser("calibrate", "measure the local vLLM engine for the simulator's cpu preset")
    parser.add_argument("--config", required=True, help="YAML config (model, generate_config)")
    parser.add_argument("--out", required=True, help="calibration JSON to write (asp-calib/1)")
    parser.add_argument("--quick", action="store_true", help="fewer points (CI / smoke test)")
    parser.add_argument("--repeats", type=int, default=2, help="measurements per point (median)")
    parser.add_argument("overrides", nargs="*", help="config overrides key=value")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        raise UserError("--repeats must be >= 1")
    check_writable(args.out)
    cfg = load_config(args.config, args.overrides)
    result = calibrate(cfg, quick=args.quick, repeats=args.repeats)
    atomic_write_json(args.out, result, indent=1)
    s = result["decode_step_s"]
    print(
        f"wrote {args.out}: decode step = {s['a'] * 1e3:.3f} ms + {s['b_per_seq'] * 1e3:.4f} ms/seq "
        f"+ {s['c_per_kv_token'] * 1e6:.4f} us/KV token; "
        f"prefill {result['prefill_s_per_token'] or 0:.2e} s/token; refresh {result['refresh_s'] or 0:.3f} s"
    )
    return 0
