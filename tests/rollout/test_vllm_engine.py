"""The vLLM engine on CPU with a freshly built tiny model: generation, logprob parity, weight refresh."""

from __future__ import annotations

import os

import numpy as np
import pytest

from asp_npu.data.tasks import make_prompts
from asp_npu.errors import UserError
from asp_npu.rollout.engine import EngineSettings, LoopThread, PromptTooLongError, SamplingSettings
from asp_npu.types import PromptItem

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from asp_npu.device import rollout_env
    from asp_npu.rollout.vllm_engine import VLLMEngine

    loop = LoopThread()
    env = rollout_env("cpu", [0], kv_cache_gib=1)
    saved = {k: os.environ.get(k) for k in env}

    async def build():
        # a small token budget: a few long prompts exceed it (chunked prefill territory)
        # prefix caching off: what the pipeline runs with in-flight weight refresh
        settings = EngineSettings(
            str(tiny_model_dir), max_model_len=256, max_num_seqs=32, max_num_batched_tokens=256,
            enable_prefix_caching=False,
        )
        return VLLMEngine(settings, env)

    eng = loop.run(build())
    yield eng, loop
    eng.shutdown()
    loop.close()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    model.eval()
    return model


def hf_logprobs(model, prompt_ids: list[int], response_ids: list[int], temperature: float) -> np.ndarray:
    """Log-probabilities of `response_ids` under the temperature-scaled HF model."""
    import torch

    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].double() / temperature
    lp = torch.log_softmax(logits, dim=-1)
    return lp[torch.arange(len(response_ids)), torch.tensor(response_ids)].numpy()


def test_generates_groups_with_all_fields(engine):
    eng, loop = engine
    item = make_prompts("count", 1, seed=3)[0]
    trajs = loop.run(eng.generate(item, SamplingSettings(n=3, max_tokens=24, seed=7)))
    assert [t.sample_idx for t in trajs] == [0, 1, 2]
    prompt_ids = eng.encode_prompt(item)
    for t in trajs:
        assert t.prompt_id == item.prompt_id and t.prompt_token_ids == prompt_ids
        assert 1 <= len(t.response_token_ids) <= 24 and len(t.logprobs) == len(t.response_token_ids)
        assert all(lp <= 0 for lp in t.logprobs)
        assert t.finish_reason in ("stop", "length")
        assert t.finish_reason == "stop" or len(t.response_token_ids) == 24
        assert 0.0 <= t.reward <= 1.0 and t.policy_version == eng.policy_version
        assert t.t_submitted <= t.t_finished and t.t_first_token == 0.0  # not streamed: not measured
    # streamed, the same seeds give the same samples, text (so reward) and logprobs, and a first-token time
    streamed = loop.run(eng.generate(item, SamplingSettings(n=3, max_tokens=24, seed=7, stream=True)))
    for t, s in zip(trajs, streamed, strict=True):
        assert s.response_token_ids == t.response_token_ids and s.reward == t.reward
        assert s.logprobs == pytest.approx(t.logprobs, abs=1e-5)
        assert s.t_submitted <= s.t_first_token <= s.t_finished
    # three samples of a random model under different seeds do not all agree
    assert len({tuple(t.response_token_ids) for t in trajs}) > 1
    # the same seed reproduces the same sample
    again = loop.run(eng.generate(item, SamplingSettings(n=1, max_tokens=24, seed=7), [1]))
    assert again[0].response_token_ids == trajs[1].response_token_ids
    assert eng.num_in_flight() == 0 and eng.activity.busy_intervals()


def test_remax_instance_attaches_the_greedy_baseline_to_its_group(engine):
    """adv_estimator remax: the rollout instance generates one greedy response beside each group, scores
    it with the same reward function and records that reward on every trajectory of the group; it is
    not delivered as a sample and its tokens are counted apart (`baseline_tokens`)."""
    from asp_npu.data.rewards import compute_reward
    from asp_npu.rollout.instance import RolloutInstance, UnitSpec
    from asp_npu.trainer.batching import Estimator, batch_advantages
    from asp_npu.types import TrainBatch

    eng, loop = engine
    item = make_prompts("count", 1, seed=11)[0]
    (greedy,) = loop.run(eng.generate(item, SamplingSettings(temperature=0.0, max_tokens=12)))
    text = eng.tokenizer.decode(greedy.response_token_ids, skip_special_tokens=True)
    item.ground_truth = text  # the greedy answer is the right one: baseline 1.0, sampled answers score less
    sampling = SamplingSettings(n=4, temperature=1.0, max_tokens=12, seed=7, greedy_baseline=True)

    async def run():
        inst = RolloutInstance(0, eng.settings, sampling)
        inst.attach_engine(eng)
        await inst.add_prompts([item])
        await inst.submit_units([UnitSpec(0, tuple((item.prompt_id, i) for i in range(4)))])
        try:
            assert await inst.wait_idle(300)
            return await inst.poll(), await inst.stats()
        finally:
            inst._runner.cancel()  # the module's engine keeps running for the other tests

    (group,), stats = loop.run(run())
    assert [t.sample_idx for t in group] == [0, 1, 2, 3]  # the greedy response is not a sample
    assert {t.reward_baseline for t in group} == {1.0}
    assert {t.baseline_len for t in group} == {len(greedy.response_token_ids)}
    assert stats["baseline_tokens"] == len(greedy.response_token_ids) and not stats["errors"]
    assert stats["tokens_generated"] == sum(t.response_len for t in group)
    ds = item.meta["data_source"]
    for t in group:  # the samples are scored by the same function
        assert t.reward == compute_reward(ds, eng.tokenizer.decode(t.response_token_ids,
                                                                   skip_special_tokens=True), text)
    assert any(t.response_token_ids != greedy.response_token_ids for t in group)  # sampled, not greedy
    adv = batch_advantages(TrainBatch(group, 4), Estimator("remax"))
    for t, a in zip(group, adv, strict=True):
        assert a == pytest.approx([t.reward - 1.0] * t.response_len)


def test_max_tokens_and_explicit_prompt_ids(engine):
    eng, loop = engine
    item = PromptItem("raw", prompt_token_ids=[5, 40, 41, 42, 6])
    (t,) = loop.run(eng.generate(item, SamplingSettings(max_tokens=9, ignore_eos=True, seed=1)))
    assert t.prompt_token_ids == [5, 40, 41, 42, 6]
    assert len(t.response_token_ids) == 9 and t.finish_reason == "length"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_hf_forward(engine, hf_model, temperature):
    eng, loop = engine
    items = make_prompts("rle", 2, seed=11)
    sampling = SamplingSettings(n=2, max_tokens=32, temperature=temperature, seed=5)
    for item in items:
        for t in loop.run(eng.generate(item, sampling)):
            ref = hf_logprobs(hf_model, t.prompt_token_ids, t.response_token_ids, temperature)
            assert np.max(np.abs(ref - np.array(t.logprobs))) < 1e-4


@pytest.mark.parametrize("cut", [{"top_k": 1}, {"min_p": 1.0}])
def test_top_k_and_min_p_reach_vllm_and_truncate_the_behaviour_logprobs(engine, hf_model, cut):
    """top_k 1 (or min_p 1) at temperature 1 keeps only the most likely token: the samples are the greedy
    ones and their recorded logprobs are 0 (the truncated, renormalised distribution), while the whole
    distribution gives them less -- why `config.truncation_problems` refuses the importance correction."""
    eng, loop = engine
    item = make_prompts("rle", 1, seed=11)[0]
    (greedy,) = loop.run(eng.generate(item, SamplingSettings(max_tokens=16, temperature=0.0, seed=5)))
    (cut_t,) = loop.run(eng.generate(item, SamplingSettings(max_tokens=16, temperature=1.0, seed=5, **cut)))
    assert cut_t.response_token_ids == greedy.response_token_ids
    assert np.max(np.abs(np.array(cut_t.logprobs))) < 1e-6
    whole = hf_logprobs(hf_model, cut_t.prompt_token_ids, cut_t.response_token_ids, 1.0)
    assert np.all(whole < -1e-3)


def test_prompt_too_long_is_one_clear_error_and_engine_keeps_working(engine):
    eng, loop = engine
    long_item = PromptItem("too-long", prompt_token_ids=[40] * 300)
    with pytest.raises(PromptTooLongError, match="too-long: 300 tokens.*256"):
        loop.run(eng.generate(long_item, SamplingSettings(max_tokens=4)))
    (t,) = loop.run(eng.generate(make_prompts("count", 1, seed=1)[0], SamplingSettings(max_tokens=4)))
    assert t.response_token_ids


def test_seeded_long_prompts_beyond_the_token_budget_do_not_kill_the_engine(engine):
    eng, loop = engine
    import asyncio

    items = [
        PromptItem(f"long-{i}", prompt_token_ids=[10 + (i * 7 + j) % 400 for j in range(200)])
        for i in range(4)
    ]

    async def batch():
        return await asyncio.gather(
            *(eng.generate(it, SamplingSettings(n=2, max_tokens=8, seed=3)) for it in items)
        )

    groups = loop.run(batch(), timeout=120)
    assert [len(g) for g in groups] == [2, 2, 2, 2]
    assert all(len(t.response_token_ids) >= 1 for g in groups for t in g)


def test_weight_refresh_matches_refreshed_hf_model(engine, hf_model):
    import torch

    eng, loop = engine
    item = make_prompts("addsteps", 1, seed=2)[0]
    sampling = SamplingSettings(n=2, max_tokens=32, seed=9)
    before = loop.run(eng.generate(item, sampling))

    # bad refreshes are refused before they reach the worker; the engine keeps its weights
    with pytest.raises(UserError, match="not a parameter"):
        loop.run(eng.refresh_weights({"model.nope.weight": np.zeros((2, 2), np.float32)}, 99))
    emb = hf_model.state_dict()["model.embed_tokens.weight"]
    with pytest.raises(UserError, match="shape"):
        loop.run(eng.refresh_weights({"model.embed_tokens.weight": emb[:3].numpy()}, 99))
    assert eng.policy_version == 0

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf_model.parameters():
            p.add_(0.2 * p.std().clamp_min(1e-3) * torch.randn(p.shape, generator=gen))
    # numpy, and without lm_head.weight for a tied model: exactly what the trainer's HF export sends
    new_state = {k: v.numpy().copy() for k, v in hf_model.state_dict().items()
                 if not (k == "lm_head.weight" and hf_model.config.tie_word_embeddings)}
    report = loop.run(eng.refresh_weights(new_state, 1))
    assert report.version == 1 and eng.policy_version == 1
    assert 0 < report.load_s <= report.total_s and report.num_bytes > 0

    after = loop.run(eng.generate(item, sampling))
    assert all(t.policy_version == 1 for t in after) and all(t.policy_version == 0 for t in before)
    for t in after:
        ref = hf_logprobs(hf_model, t.prompt_token_ids, t.response_token_ids, 1.0)
        assert np.max(np.abs(ref - np.array(t.logprobs))) < 1e-4
    # the same seeds under new weights give different samples or at least different logprobs
    changed = [
        b.response_token_ids != a.response_token_ids
        or np.max(np.abs(np.subtract(b.logprobs[:5], a.logprobs[:5]))) > 1e-3
        for b, a in zip(before, after, strict=True)
    ]
    assert all(changed)


def test_inflight_refresh_loads_while_a_sequence_keeps_decoding(engine, hf_model):
    """drain=False: the weights load mid-sequence; the sample records its first and last version."""
    import asyncio
    import time

    eng, loop = engine
    item = make_prompts("count", 1, seed=5)[0]
    state = {k: v.numpy().copy() for k, v in hf_model.state_dict().items()
             if not (k == "lm_head.weight" and hf_model.config.tie_word_embeddings)}
    v0 = eng.policy_version

    async def scenario():
        task = asyncio.ensure_future(
            eng.generate(item, SamplingSettings(max_tokens=200, ignore_eos=True, seed=1)))
        while eng.num_in_flight() == 0:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        report = await eng.refresh_weights(state, v0 + 1, drain=False)
        t_loaded = time.time()
        (t,) = await task
        return report, t_loaded, t

    report, t_loaded, t = loop.run(scenario())
    assert report.drain_s == 0.0 and eng.policy_version == v0 + 1
    assert t_loaded < t.t_finished and t.response_len == 200 and len(t.logprobs) == 200
    assert t.policy_version == v0 and t.policy_version_last == v0 + 1
    # the worker's count at the load splits the tokens: every token's behaviour version is recorded
    (first, (n, v)) = t.version_changes
    assert first == [0, v0] and v == v0 + 1 and 0 < n < 200
    assert t.token_versions() == [v0] * n + [v0 + 1] * (200 - n)


def test_pause_holds_new_sequences_until_resume(engine):
    eng, loop = engine
    import asyncio

    item = make_prompts("count", 1, seed=4)[0]

    async def scenario():
        await eng.pause()
        task = asyncio.ensure_future(eng.generate(item, SamplingSettings(max_tokens=4)))
        await asyncio.sleep(0.3)
        held = not task.done() and eng.num_in_flight() == 0
        await eng.resume()
        (t,) = await task
        return held, t

    held, t = loop.run(scenario())
    assert held and t.response_token_ids and not eng.paused


def test_calibration_of_this_engine_feeds_the_simulator(engine, tiny_model_dir, tmp_path):
    """Runs last: it reloads the folder's weights (the refresh measurement)."""
    from asp_npu.io import atomic_write_json
    from asp_npu.pipeline.calibrate import measure_engine
    from asp_npu.sim.calibrate import SCHEMA, calibration
    from asp_npu.sim.cost import SimCost
    from asp_npu.sim.preset import apply_calibration

    eng, loop = engine
    m = measure_engine(eng, loop, str(tiny_model_dir), max_num_seqs=16, quick=True, repeats=1)
    d = calibration(m.model, m.points, m.meta)
    assert d["schema"] == SCHEMA and d["model"] == str(tiny_model_dir) and d["trainer_s_per_token"] is None
    assert set(d["decode_step_s"]) == {"a", "b_per_seq", "c_per_kv_token"}
    assert all(v >= 0 for v in d["decode_step_s"].values()) and d["decode_step_s"]["a"] > 0
    assert d["prefill_s_per_token"] >= 0 and d["refresh_s"] > 0
    assert {p["batch"] for p in d["points"]["decode"]} == {1, 4, 16}
    assert len(d["points"]["prefill"]) == 2 and len(d["points"]["refresh"]) == 1
    atomic_write_json(tmp_path / "calib.json", d)
    cost, _ = apply_calibration(SimCost(), tmp_path / "calib.json")
    assert cost.decode_a == pytest.approx(d["decode_step_s"]["a"])
    assert cost.refresh_s == pytest.approx(d["refresh_s"])
