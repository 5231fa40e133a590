"""The rollout engine scores every sample through its verifier pool: a custom reward function that hangs
or raises costs those samples their custom part (0, counted in `reward_failures`), and the engine keeps
generating; the other verifiers' parts are kept."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from asp_npu.data.rewards import RewardSpec, compute_reward
from asp_npu.data.tasks import make_prompts
from asp_npu.rollout.engine import EngineSettings, LoopThread, SamplingSettings

pytestmark = pytest.mark.slow

CUSTOM = '''
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    mode = (extra_info or {}).get("mode")
    if mode == "hang":
        while True:
            time.sleep(60)
    if mode == "boom":
        raise RuntimeError("a verifier bug")
    return 0.25
'''


def test_engine_rewards_go_through_the_pool(tiny_model_dir, tmp_path: Path):
    from asp_npu.device import rollout_env
    from asp_npu.rollout.vllm_engine import VLLMEngine

    custom = tmp_path / "rw.py"
    custom.write_text(CUSTOM)
    spec = RewardSpec(("custom", "auto"), (1.0, 2.0), f"{custom}:compute_score", timeout_s=10.0,
                      num_workers=2)
    loop = LoopThread()
    env = rollout_env("cpu", [0], kv_cache_gib=1)
    saved = {k: os.environ.get(k) for k in env}
    eng = loop.run(_build(VLLMEngine, EngineSettings(str(tiny_model_dir), max_model_len=256, max_num_seqs=8,
                                                     reward=spec), env))
    try:
        items = make_prompts("count", 3, seed=5)
        for item, mode in zip(items, ("hang", "ok", "boom"), strict=True):
            item.meta["extra_info"] = {"mode": mode}
        sampling = SamplingSettings(n=2, max_tokens=16, seed=3)

        async def all_groups():
            return await asyncio.gather(*(eng.generate(i, sampling) for i in items))

        hang, ok, boom = loop.run(all_groups())
        for item, group, custom_part, failures in zip(items, (hang, ok, boom), (0.0, 0.25, 0.0), (1, 0, 1),
                                                      strict=True):
            for t in group:
                text = eng.tokenizer.decode(t.response_token_ids, skip_special_tokens=True)
                auto = compute_reward("asp/count", text, item.ground_truth)
                assert t.reward_failures == failures
                assert t.reward == pytest.approx(custom_part + 2.0 * auto)
                # each verifier's own score is recorded with the sample (DAPO's filter metric reads it)
                assert t.scores == pytest.approx({"custom": custom_part, "auto": auto})
        assert eng.rewards.stats() == {"calls": 12, "timeouts": 2, "errors": 2, "workers_replaced": 2}
    finally:
        eng.shutdown()
        loop.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert all(w.proc is None for w in eng.rewards.pool._all)  # shutdown stopped the verifier workers


async def _build(cls, settings, env):
    return cls(settings, env)
