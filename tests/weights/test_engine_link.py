"""weight_refresh through vLLM's weight-transfer engine (`gloo` on CPU), driven like the controller will:
real RolloutInstance actors, a trainer-side sender actor, `TransferEngineLink.connect` / `publish`."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from asp_npu.data.tasks import make_prompts
from asp_npu.device import weight_transfer_backend
from asp_npu.rollout.engine import EngineSettings, SamplingSettings
from asp_npu.weights.engine_link import WeightLink


@given(st.lists(st.integers(1, 8), min_size=1, max_size=6))
def test_each_instance_worker_gets_its_own_rank_after_the_trainer(workers: list[int]) -> None:
    link = WeightLink("k", "gloo", "127.0.0.1", tuple(range(len(workers))), tuple(workers))
    ranks = [o + r for o, w in zip(link.rank_offsets(), workers, strict=True) for r in range(w)]
    assert ranks == list(range(1, link.world_size))


def test_backend_choice_lives_in_device() -> None:
    assert weight_transfer_backend("cpu") == "gloo"
    assert (
        weight_transfer_backend("npu") == "nccl" and weight_transfer_backend("npu", colocated=True) == "ipc"
    )
    assert weight_transfer_backend("cuda") == "nccl"


# ---------------------------------------------------------------- real engines

GROUP = 2


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(
        address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False
    )
    yield ray
    ray.shutdown()


def untied_copy(src, dst):
    """The same model with its own lm_head (tie_word_embeddings=False), saved as an HF folder."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    head = model.get_input_embeddings().weight.detach().clone() * 0.5
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(head)
    dst.mkdir()
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "chat_template.jinja"):
            shutil.copy(f, dst / f.name)
    model.save_pretrained(str(dst))
    return dst


def perturbed(model_dir, seed: int):
    """The HF model with every parameter moved (what one training step would ship), and its export."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * p.std().clamp_min(1e-3) * torch.randn(p.shape, generator=gen))
    tied = model.config.tie_word_embeddings
    # like the trainer's HF export: a tied model's state dict leaves lm_head.weight out
    state = {
        k: v.numpy().copy() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")
    }
    return model, state


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist()


def hf_logprobs(model, prompt: list[int], response: list[int]) -> np.ndarray:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].double()
    lp = torch.log_softmax(logits, dim=-1)
    return lp[torch.arange(len(response)), torch.tensor(response)].numpy()


def units(prompt_ids: list[str], first: int, n: int = GROUP) -> list[dict]:
    return [
        {"unit": first + k, "samples": [{"prompt_id": p, "sample_idx": i} for i in range(n)]}
        for k, p in enumerate(prompt_ids)
    ]


def run(ray, inst, items, sampling, first_unit: int):
    ray.get(inst.run_plan.remote(units([it.prompt_id for it in items], first_unit), items, sampling, 300))
    return [t for g in ray.get(inst.poll.remote()) for t in g]


def check_refresh(ray, inst, model_dir, unit0: int) -> None:
    """Greedy tokens equal the refreshed HF model's, behaviour logprobs within 1e-4, twice over one
    group; buckets are small so fused q/k/v and gate/up layers straddle several."""
    from asp_npu.weights.engine_link import RayTrainer, StateDictTrainer, TransferEngineLink

    v0 = version(ray, inst)
    trainer_actor = ray.remote(StateDictTrainer).options(num_cpus=0).remote()
    sync = TransferEngineLink(kind="cpu", drain=True, bucket_bytes=96 << 10, timeout_s=120)
    try:
        assert sync.backend == "gloo"
        items = make_prompts("count", 2, seed=11)
        greedy = SamplingSettings(temperature=0.0, max_tokens=16, ignore_eos=True)
        before = run(ray, inst, items, greedy, unit0)
        model, state = perturbed(model_dir, seed=5)
        ray.get(trainer_actor.set_weights.remote(state, v0 + 1))
        sync.connect([inst], RayTrainer(trainer_actor))
        out = sync.publish(v0 + 1)
        (report,) = out["instances"]
        assert report["version"] == v0 + 1 and report["num_bytes"] == sum(v.nbytes for v in state.values())
        assert report["load_s"] > 0 and out["send_s"] > 0

        after = run(ray, inst, items, greedy, unit0 + 10)
        assert {t.policy_version for t in after} == {v0 + 1} and {t.policy_version for t in before} == {v0}
        for t in after:
            assert t.response_token_ids == hf_greedy(model, t.prompt_token_ids, 16)
        assert [t.response_token_ids for t in after] != [t.response_token_ids for t in before]

        sampled = run(ray, inst, items, SamplingSettings(temperature=1.0, max_tokens=24, seed=4), unit0 + 20)
        for t in sampled:
            ref = hf_logprobs(model, t.prompt_token_ids, t.response_token_ids)
            assert np.max(np.abs(ref - np.array(t.logprobs))) < 1e-4

        # a second refresh over the same group (versions increase, the group is reused)
        model2, state2 = perturbed(model_dir, seed=6)
        ray.get(trainer_actor.set_weights.remote(state2, v0 + 2))
        assert sync.publish(v0 + 2)["instances"][0]["version"] == v0 + 2
        (t,) = run(ray, inst, items[:1], greedy, unit0 + 30)[:1]
        assert t.policy_version == v0 + 2
        assert t.response_token_ids == hf_greedy(model2, t.prompt_token_ids, 16)
    finally:
        sync.close()
        ray.kill(trainer_actor)


def version(ray, inst) -> int:
    return ray.get(inst.stats.remote())["policy_version"]


@pytest.mark.slow
def test_refresh_of_untied_embeddings_matches_the_refreshed_hf_model(ray_cluster, tmp_path_factory):
    """A model with its own lm_head, large enough for many buckets per layer, on its own instance."""
    from asp_npu.data.init_model import build_model_dir
    from asp_npu.rollout.instance import launch_instances

    ray = ray_cluster
    root = tmp_path_factory.mktemp("small-untied")
    model_dir = untied_copy(build_model_dir(root / "tied", size="small", seed=3), root / "untied")
    settings = EngineSettings(str(model_dir), max_model_len=256, max_num_seqs=8)
    (inst,) = launch_instances(1, settings, SamplingSettings(), kind="cpu", kv_cache_gib=0.5)
    try:
        check_refresh(ray, inst, model_dir, 0)
    finally:
        ray.get(inst.shutdown.remote())
        ray.kill(inst)


class _Rank0:
    """`StateDictTrainer` reached the way the pipeline reaches a trainer rank (`call(method, ...)`)."""

    def __init__(self) -> None:
        from asp_npu.weights.engine_link import StateDictTrainer

        self.body = StateDictTrainer()

    def call(self, method: str, *args):
        return getattr(self.body, method)(*args)


class _Group:
    def __init__(self, actor) -> None:
        self.actors = [actor]

    def push_weights_to_rollout(self, link, send: bool = True):
        import ray

        return ray.get(self.actors[0].call.remote("push_weights_to_rollout", link, send), timeout=300)


@pytest.mark.slow
def test_a_member_killed_before_a_push_is_one_line_and_the_survivor_refreshes_over_a_new_group(
    ray_cluster, tiny_model_dir
):
    """Instance 0 dies unnoticed; the next push starts the update on instance 1, then breaks on 0:
    recovery gets instance 0 in one line (`ActorLost`), the group is re-formed over instance 1 alone
    (its worker leaves the update the broken push left open) and it generates with the new weights."""
    from asp_npu.remote import ActorLost
    from asp_npu.rollout.instance import launch_instances
    from asp_npu.weights.refresh import TransferEngineWeights

    ray = ray_cluster
    settings = EngineSettings(str(tiny_model_dir), max_model_len=256, max_num_seqs=4)
    insts = launch_instances(2, settings, SamplingSettings(), kind="cpu", kv_cache_gib=0.5)
    rank0 = ray.remote(_Rank0).options(num_cpus=0).remote()
    model, state = perturbed(tiny_model_dir, seed=9)
    ray.get(rank0.call.remote("set_weights", state, 1))
    try:
        w = TransferEngineWeights(_Group(rank0), insts, drain=True, timeout_s=60)
        ray.kill(insts[0])
        w.publish(w.gather(), 1)
        w.refresh()
        t0 = time.monotonic()
        with pytest.raises(ActorLost) as lost:
            while time.monotonic() - t0 < 120:
                w.poll()
                time.sleep(0.05)
        assert lost.value.who == "rollout instance 0" and "\n" not in str(lost.value)
        w.lost(0)
        done = []
        while w.pending() and time.monotonic() - t0 < 240:
            done += w.poll()
            time.sleep(0.05)
        assert [(r.instance, r.version) for r in done] == [(1, 1)] and w.held == [0, 1]
        items = make_prompts("count", 1, seed=14)
        greedy = SamplingSettings(temperature=0.0, max_tokens=12, ignore_eos=True)
        for t in run(ray, insts[1], items, greedy, 0):
            assert t.policy_version == 1
            assert t.response_token_ids == hf_greedy(model, t.prompt_token_ids, 12)
    finally:
        for a in (*insts, rank0):
            ray.kill(a)


# ---------------------------------------------------------------- one instance, shared in file order
# An engine start is most of each test's cost, so the tests below share one tiny instance (prefix caching
# off: in-flight refresh), each over a weight group of its own. They run in this order: the megatron
# trainer's push first (its first step is version 1), the others from the version the instance holds, and
# the last kills it. The tests above launch their own instances first: Ray has 2 CPUs, one per instance.


@pytest.fixture(scope="module")
def instance(ray_cluster, tiny_model_dir):
    from asp_npu.rollout.instance import launch_instances

    settings = EngineSettings(
        str(tiny_model_dir), max_model_len=512, max_num_seqs=8, enable_prefix_caching=False
    )
    (inst,) = launch_instances(1, settings, SamplingSettings(), kind="cpu", kv_cache_gib=0.5)
    yield inst
    ray_cluster.kill(inst)


@pytest.fixture
def linked(ray_cluster, instance):
    """A fresh trainer-side sender connected to the shared instance over a new weight group."""
    from asp_npu.weights.engine_link import RayTrainer, StateDictTrainer, TransferEngineLink

    ray = ray_cluster
    trainer_actor = ray.remote(StateDictTrainer).options(num_cpus=0).remote()
    sync = TransferEngineLink(kind="cpu", drain=True, timeout_s=30)  # the keep test switches it
    sync.connect([instance], RayTrainer(trainer_actor))
    yield ray, instance, trainer_actor, sync
    sync.close()
    ray.kill(trainer_actor)


@pytest.mark.slow
def test_the_megatron_trainer_pushes_from_rank_0(ray_cluster, instance, tiny_model_dir):
    """A real trainer (PP=2: two stages meet on rank 0) trains one step and pushes through
    `push_weights_to_rollout`; the instance then generates what the trainer's HF export generates.
    The first test on the shared instance: the trainer's first step is weights version 1."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from asp_npu.trainer.group import TrainerGroup
    from asp_npu.weights.engine_link import TransferEngineLink
    from tests.trainer.helpers import make_batch, trainer_config

    ray, inst = ray_cluster, instance
    assert version(ray, inst) == 0
    group = TrainerGroup(trainer_config(tiny_model_dir, pp=2, lr=5e-2), cpus_per_rank=0)
    sync = TransferEngineLink(kind="cpu", timeout_s=120)
    try:
        group.train_step(make_batch(seed=1))
        sync.connect([inst], group)
        (report,) = sync.publish(1)["instances"]
        hf = group.get_hf_weights()
        assert report["version"] == hf.version == 1
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(tiny_model_dir)))
        model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in hf.tensors.items()}, strict=False)
        model.tie_weights()
        model.eval()
        items = make_prompts("count", 2, seed=13)
        greedy = SamplingSettings(temperature=0.0, max_tokens=16, ignore_eos=True)
        for t in run(ray, inst, items, greedy, 300):
            assert t.policy_version == 1
            assert t.response_token_ids == hf_greedy(model, t.prompt_token_ids, 16)
    finally:
        sync.close()
        group.shutdown()


@pytest.mark.slow
def test_refresh_of_tied_embeddings_matches_the_refreshed_hf_model(ray_cluster, instance, tiny_model_dir):
    """A tied model's export leaves lm_head out; the engine ties it again."""
    check_refresh(ray_cluster, instance, tiny_model_dir, 100)


@pytest.mark.slow
def test_keep_mode_refreshes_mid_flight_and_records_first_and_last_version(linked, tiny_model_dir):
    """pause_generation(mode="keep"): running sequences freeze, the weights load, they continue on
    the new ones; each sample records the version of its first and of its last token."""
    ray, inst, trainer_actor, sync = linked
    v0 = version(ray, inst)
    sync.set_drain(False)  # on the connected group: the trainer side must follow
    _, state = perturbed(tiny_model_dir, seed=7)
    ray.get(trainer_actor.set_weights.remote(state, v0 + 1))
    items = make_prompts("count", 1, seed=12)
    sampling = SamplingSettings(max_tokens=300, ignore_eos=True, seed=2)
    ray.get(inst.add_prompts.remote(items))
    ray.get(inst.submit_units.remote(units([items[0].prompt_id], 200), sampling))
    while ray.get(inst.stats.remote())["in_flight"] < GROUP:
        time.sleep(0.01)
    time.sleep(0.2)
    out = sync.publish(v0 + 1)
    t_loaded = time.time()
    (report,) = out["instances"]
    assert report["version"] == v0 + 1 and report["drain_s"] == 0.0
    assert ray.get(inst.wait_idle.remote(300))
    (group,) = ray.get(inst.poll.remote())
    for t in group:
        assert t.response_len == 300 and len(t.logprobs) == 300
        assert t.policy_version == v0 and t.policy_version_last == v0 + 1 and t.t_finished > t_loaded
        # counted while vLLM held the sequences frozen: every token's behaviour version is exact
        (first, (n, v)) = t.version_changes
        assert first == [0, v0] and v == v0 + 1 and 0 < n < 300


@pytest.mark.slow
def test_a_dead_trainer_is_one_line_not_a_hang(linked):
    """The instance waits inside the transfer; the trainer (group rank 0) is killed: the instance's
    wait ends with one line naming itself, and the driver's next publish names the trainer."""
    from asp_npu.weights.engine_link import WeightSyncError

    ray, inst, trainer_actor, sync = linked
    ray.get(inst.start_weight_update.remote(True))
    waiting = inst.update_weights.remote({"version": 99})
    time.sleep(1.0)
    t0 = time.monotonic()
    ray.kill(trainer_actor)
    with pytest.raises(Exception) as err:
        ray.get(waiting, timeout=60)
    assert time.monotonic() - t0 < 60
    line = str(err.value.cause if hasattr(err.value, "cause") else err.value).strip().splitlines()[-1]
    assert "rollout instance 0: weight transfer broke off" in line
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError) as err2:
        sync.publish(100)
    assert time.monotonic() - t0 < 60
    msg = str(err2.value)
    assert "\n" not in msg and "the trainer (weight-group rank 0) is gone" in msg


@pytest.mark.slow
def test_a_dead_instance_is_one_line_naming_it(linked, tiny_model_dir):
    """The last test on the shared instance: it kills it."""
    from asp_npu.weights.engine_link import WeightSyncError

    ray, inst, trainer_actor, sync = linked
    v1 = version(ray, inst) + 1
    _, state = perturbed(tiny_model_dir, seed=8)
    ray.get(trainer_actor.set_weights.remote(state, v1))
    ray.kill(inst)
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError) as err:
        sync.publish(v1)
    assert time.monotonic() - t0 < 60
    msg = str(err.value)
    assert "\n" not in msg and "rollout instance 0 (weight-group rank 1)" in msg


