"""Two RolloutInstance Ray actors with real vLLM engines on two CPU cores (one pair of engines per module)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from asp_npu.data.tasks import LengthDist, make_prompts
from asp_npu.errors import UserError
from asp_npu.rollout.engine import EngineSettings, SamplingSettings
from asp_npu.types import PromptItem

pytestmark = pytest.mark.slow
GROUP = 4


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(
        address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False
    )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def instances(ray_cluster, tiny_model_dir):
    from asp_npu.rollout.instance import CollectingSink, launch_instances

    ray = ray_cluster
    sink = ray.remote(CollectingSink).remote()
    settings = EngineSettings(str(tiny_model_dir), max_model_len=512, max_num_seqs=32)
    sampling = SamplingSettings(max_tokens=48, ignore_eos=True, seed=1)
    actors = launch_instances(2, settings, sampling, kind="cpu", kv_cache_gib=1, sink=sink)
    yield actors, sink, settings
    ray.get([a.shutdown.remote() for a in actors])
    for a in actors:
        ray.kill(a)


def plan_units(prompt_ids: list[str], groups_per_unit: int, first_unit: int = 0) -> list[dict]:
    """Units in the `asp-plan/1` JSON shape: whole groups of GROUP samples."""
    units = []
    for k in range(0, len(prompt_ids), groups_per_unit):
        samples = [
            {"prompt_id": p, "sample_idx": i, "predicted_len": 48}
            for p in prompt_ids[k : k + groups_per_unit]
            for i in range(GROUP)
        ]
        units.append({"unit": first_unit + len(units), "samples": samples})
    return units


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def span(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def test_everything_stays_on_loopback(ray_cluster):
    assert ray_cluster.util.get_node_ip_address() == "127.0.0.1"


def test_each_instance_is_pinned_to_its_own_core(instances, ray_cluster):
    actors, _, _ = instances
    affinity = ray_cluster.get([a.worker_cpu_affinity.remote() for a in actors])
    assert affinity == [[0], [1]]


def test_two_instances_generate_in_parallel(instances, ray_cluster):
    ray = ray_cluster
    actors, _, _ = instances
    items = make_prompts("count", 8, seed=21, dist=LengthDist(median=6, max_items=20))
    halves = [items[:4], items[4:]]
    before = ray.get([a.stats.remote() for a in actors])
    t0 = time.time()
    results = ray.get(
        [
            a.run_plan.remote(plan_units([p.prompt_id for p in half], 2, 100), half, None, 120)
            for a, half in zip(actors, halves, strict=True)
        ]
    )
    wall = time.time() - t0
    busy = [[iv for iv in r["busy_intervals"] if iv[1] > t0] for r in results]
    for r, b in zip(results, before, strict=True):
        assert r["groups_delivered"] - b["groups_delivered"] == 4 and not r["errors"]
    serial = span(busy[0]) + span(busy[1])
    # both ran at the same time for most of their work, so the wall time is well below the serial sum
    assert overlap(busy[0], busy[1]) > 0.5 * min(span(busy[0]), span(busy[1]))
    assert wall < 0.85 * serial + 1.0
    groups = [g for a in actors for g in ray.get(a.poll.remote())]
    assert sorted(g[0].prompt_id for g in groups) == sorted(p.prompt_id for p in items)
    assert all(len(g) == GROUP and all(len(t.response_token_ids) == 48 for t in g) for g in groups)
    assert {g[0].instance for g in groups} == {0, 1}


def test_finished_group_is_delivered_before_the_plan_ends(instances, ray_cluster):
    ray = ray_cluster
    actors, sink, _ = instances
    items = make_prompts("rle", 6, seed=5)
    n_before = len(ray.get(sink.get.remote()))
    result = ray.get(
        actors[0].run_plan.remote(plan_units([p.prompt_id for p in items], 1, 200), items, None, 120)
    )
    t_returned = time.time()
    arrivals = ray.get(sink.get.remote())[n_before:]
    assert [g[0].prompt_id for _, g in arrivals] == [p.prompt_id for p in items]  # unit order, one group each
    plan_end = max(e["t"] for e in result["unit_events"] if e["event"] == "unit_finish" and e["unit"] == 205)
    assert arrivals[0][0] < plan_end < t_returned  # group 1 reached the sink while later units still ran
    ray.get(actors[0].poll.remote())


def test_weight_refresh_through_the_actor(instances, ray_cluster, tiny_model_dir):
    from safetensors.numpy import load_file

    ray = ray_cluster
    actors, _, _ = instances
    weights = load_file(str(tiny_model_dir / "model.safetensors"))
    weights = {k: (v * 1.5).astype(np.float32) for k, v in weights.items()}
    reports = ray.get([a.refresh_weights.remote(weights, 3) for a in actors])
    assert [r["version"] for r in reports] == [3, 3] and all(r["load_s"] > 0 for r in reports)
    item = make_prompts("count", 1, seed=8)
    ray.get(actors[1].run_plan.remote(plan_units([item[0].prompt_id], 1, 300), item, None, 60))
    (group,) = ray.get(actors[1].poll.remote())
    assert {t.policy_version for t in group} == {3}


def test_bad_input_is_reported_and_instances_keep_working(instances, ray_cluster, tmp_path):
    from asp_npu.rollout.instance import launch_instances

    ray = ray_cluster
    actors, _, settings = instances
    with pytest.raises(UserError, match="does not exist"):
        launch_instances(1, EngineSettings(str(tmp_path / "no-model")), SamplingSettings())
    good = make_prompts("count", 1, seed=9)
    bad = PromptItem("way-too-long", prompt_token_ids=[40] * 600)
    stats = ray.get(
        actors[0].run_plan.remote(
            plan_units(["way-too-long", good[0].prompt_id, "unknown-prompt"], 3, 400), [bad, *good], None, 60
        )
    )
    errors = {e["prompt_id"]: e["error"] for e in stats["errors"]}
    assert "600 tokens" in errors["way-too-long"] and "never given" in errors["unknown-prompt"]
    (group,) = ray.get(actors[0].poll.remote())
    assert group[0].prompt_id == good[0].prompt_id
    other = make_prompts("count", 1, seed=10)
    ray.get(actors[1].run_plan.remote(plan_units([other[0].prompt_id], 1, 500), other, None, 60))
    assert len(ray.get(actors[1].poll.remote())) == 1
