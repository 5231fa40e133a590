"""Pure unit-execution logic of RolloutInstance (admission, group streaming, errors) with a timed fake engine.

The fake only stands in for vLLM's timing here; the same behaviours run against real engines in
test_instance_ray.py.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from asp_npu.errors import UserError
from asp_npu.rollout.engine import ActivityLog, EngineSettings, SamplingSettings
from asp_npu.rollout.instance import RolloutInstance, UnitSpec, instance_devices, instance_placement
from asp_npu.schedule.plan import DispatchUnit, PlannedSample
from asp_npu.types import PromptItem, Trajectory


class TimedFakeEngine:
    """Each sample takes `meta['len']` (or `meta['lens'][i]`) milliseconds; concurrency is unlimited."""

    def __init__(self) -> None:
        self.activity = ActivityLog()
        self.policy_version = 0
        self.max_model_len = 1024
        self.paused = False

    def num_in_flight(self) -> int:
        return self.activity.in_flight

    def shutdown(self) -> None:
        self.activity = ActivityLog()

    async def generate(self, item, sampling, sample_indices=None):
        if item.meta.get("fail"):
            raise UserError(f"prompt {item.prompt_id}: too long")
        idxs = list(sample_indices) if sample_indices is not None else list(range(sampling.n))

        async def one(i: int) -> Trajectory:
            self.activity.start(item.prompt_id, i)
            t0 = time.time()
            n = item.meta["lens"][i] if "lens" in item.meta else item.meta["len"]
            await asyncio.sleep(n / 1000)
            self.activity.finish(item.prompt_id, i)
            return Trajectory(
                item.prompt_id,
                i,
                [1],
                [2] * n,
                [-1.0] * n,
                "stop",
                0.0,
                self.policy_version,
                t_submitted=t0,
                t_first_token=t0,
                t_finished=time.time(),
            )

        return list(await asyncio.gather(*(one(i) for i in idxs)))


def make_instance(admission: str = "unit", max_num_seqs: int = 64) -> RolloutInstance:
    inst = RolloutInstance(
        0, EngineSettings("unused", max_num_seqs=max_num_seqs), SamplingSettings(), admission=admission
    )
    inst.attach_engine(TimedFakeEngine())
    return inst


def prompts(lens: dict[str, int]) -> list[PromptItem]:
    return [PromptItem(p, meta={"len": n}) for p, n in lens.items()]


def unit(u: int, groups: list[str], n: int = 2) -> dict:
    return {
        "unit": u,
        "samples": [{"prompt_id": p, "sample_idx": i, "predicted_len": 1} for p in groups for i in range(n)],
    }


def test_unit_admission_runs_units_back_to_back_and_streams_groups():
    async def scenario():
        inst = make_instance("unit")
        await inst.add_prompts(prompts({"a": 30, "b": 30, "c": 60, "d": 60, "e": 200}))
        await inst.submit_units([unit(0, ["a", "b"]), unit(1, ["c", "d"]), unit(2, ["e"])])
        early: list = []
        while not early:
            early = await inst.poll()
            await asyncio.sleep(0.005)
        t_first = time.time()
        assert await inst.wait_idle(5)
        t_done = time.time()
        rest = early[1:] + await inst.poll()
        first = early[0]
        stats = await inst.stats()
        await inst.shutdown()
        return first, t_first, t_done, rest, stats

    first, t_first, t_done, rest, stats = asyncio.run(scenario())
    assert first[0].prompt_id in ("a", "b") and [t.sample_idx for t in first] == [0, 1]
    assert t_done - t_first > 0.15  # the first group arrived long before the plan ended
    assert sorted(g[0].prompt_id for g in rest) == sorted({"a", "b", "c", "d", "e"} - {first[0].prompt_id})
    starts = {e["unit"]: e["t"] for e in stats["unit_events"] if e["event"] == "unit_start"}
    ends = {e["unit"]: e["t"] for e in stats["unit_events"] if e["event"] == "unit_finish"}
    assert starts[1] >= ends[0] and starts[2] >= ends[1]
    assert stats["groups_delivered"] == 5 and not stats["errors"]
    assert len(stats["busy_intervals"]) >= 1
    assert sum(1 for e in stats["sequence_events"] if e["event"] == "finish") == 10


def test_continuous_admission_overlaps_units_within_capacity():
    async def scenario(cap: int):
        inst = make_instance("continuous", max_num_seqs=cap)
        await inst.add_prompts(prompts({"a": 150, "b": 20, "c": 20}))
        await inst.submit_units([unit(0, ["a"]), unit(1, ["b"]), unit(2, ["c"])])
        assert await inst.wait_idle(5)
        stats = await inst.stats()
        await inst.shutdown()
        ev = stats["unit_events"]
        return (
            {e["unit"]: e["t"] for e in ev if e["event"] == "unit_start"},
            {e["unit"]: e["t"] for e in ev if e["event"] == "unit_finish"},
        )

    starts, ends = asyncio.run(scenario(cap=8))
    assert starts[1] < ends[0] and starts[2] < ends[0]  # short units ran beside the long one
    starts, ends = asyncio.run(scenario(cap=2))
    assert starts[1] >= ends[0]  # no free slot: the next unit waits


def test_a_finished_sample_gives_its_slot_back_while_its_group_still_decodes():
    """Two slots, a group of a 150 ms and a 20 ms sample: the next unit starts in the short one's
    slot after ~20 ms, not when the whole group ends; the group is still delivered whole, once."""
    async def scenario():
        inst = make_instance("continuous", max_num_seqs=2)
        await inst.add_prompts([PromptItem("a", meta={"lens": [150, 20]}), PromptItem("b", meta={"len": 20})])
        await inst.submit_units([unit(0, ["a"]), unit(1, ["b"], n=1)])
        assert await inst.wait_idle(5)
        stats = await inst.stats()
        groups = await inst.poll()
        await inst.shutdown()
        ev = stats["unit_events"]
        return ({e["unit"]: e["t"] for e in ev if e["event"] == "unit_start"},
                {e["unit"]: e["t"] for e in ev if e["event"] == "unit_finish"}, groups)

    starts, ends, groups = asyncio.run(scenario())
    assert starts[1] < ends[0] - 0.08  # admitted while the long sample still ran
    assert sorted((len(g), g[0].prompt_id) for g in groups) == [(1, "b"), (2, "a")]


def test_continuous_admission_starts_each_group_of_a_unit_as_its_slots_free():
    """Three slots, a running 2-sample group; the next unit's two 1-sample groups need two slots: the
    first starts in the free slot at once, the second in the same slot when the first ends -- both
    long before the running group ends (a whole-unit admission would have waited for it)."""
    async def scenario():
        inst = make_instance("continuous", max_num_seqs=3)
        await inst.add_prompts(prompts({"a": 200, "b": 30, "c": 30}))
        await inst.submit_units([unit(0, ["a"]), unit(1, ["b", "c"], n=1)])
        assert await inst.wait_idle(5)
        groups = await inst.poll()
        await inst.shutdown()
        return {g[0].prompt_id: max(t.t_finished for t in g) for g in groups}

    done = asyncio.run(scenario())
    assert done["b"] < done["c"] < done["a"] - 0.08


def test_group_split_across_units_is_delivered_once_complete():
    async def scenario():
        inst = make_instance("unit")
        await inst.add_prompts(prompts({"a": 10, "b": 10}))
        u0 = {
            "unit": 0,
            "samples": [
                {"prompt_id": "a", "sample_idx": 0},
                {"prompt_id": "b", "sample_idx": 0},
                {"prompt_id": "b", "sample_idx": 1},
            ],
        }
        u1 = {"unit": 1, "samples": [{"prompt_id": "a", "sample_idx": 1}]}
        await inst.submit_units([u0, u1])
        assert await inst.wait_idle(5)
        groups = await inst.poll()
        await inst.shutdown()
        return groups

    groups = asyncio.run(scenario())
    assert [g[0].prompt_id for g in groups] == ["b", "a"]
    assert [t.sample_idx for t in groups[1]] == [0, 1]


def test_bad_prompts_are_reported_and_the_rest_still_runs():
    async def scenario():
        inst = make_instance("unit")
        items = prompts({"ok": 10, "long": 10})
        items[1].meta["fail"] = True
        await inst.add_prompts(items)
        await inst.submit_units([unit(0, ["ok", "long", "missing"]), unit(1, ["ok"])])
        assert await inst.wait_idle(5)
        groups = await inst.poll()
        stats = await inst.stats()
        await inst.shutdown()
        return groups, stats

    groups, stats = asyncio.run(scenario())
    assert [g[0].prompt_id for g in groups] == ["ok"] and len(groups[0]) == 4
    errs = {e["prompt_id"]: e for e in stats["errors"]}
    assert set(errs) == {"long", "missing"}
    assert "too long" in errs["long"]["error"] and "never given" in errs["missing"]["error"]
    assert all(e["user_error"] for e in errs.values())


def test_unit_spec_accepts_plan_units_and_plan_json():
    du = DispatchUnit(
        3, 1, 2, 0.0, 1.0, [PlannedSample("p", 0, 5), PlannedSample("p", 1, 5), PlannedSample("q", 0, 9)]
    )
    spec = UnitSpec.of(du)
    assert spec.unit == 3 and spec.target_step == 2
    assert spec.groups() == {"p": [0, 1], "q": [0]}
    as_json = {
        "unit": 3,
        "target_step": 2,
        "samples": [
            {"prompt_id": s.prompt_id, "sample_idx": s.sample_idx, "predicted_len": s.predicted_len}
            for s in du.samples
        ],
    }
    assert UnitSpec.of(as_json) == spec


def test_instance_devices_pack_nodes_and_refuse_oversized_instances():
    assert [instance_devices(i, 1, 2) for i in range(4)] == [[0], [1], [0], [1]]
    assert [instance_devices(i, 4, 16) for i in range(5)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
        [12, 13, 14, 15],
        [0, 1, 2, 3],
    ]
    with pytest.raises(UserError, match="needs 4 devices"):
        instance_devices(0, 4, 2)


def test_unknown_admission_is_a_user_error():
    with pytest.raises(UserError, match="admission"):
        RolloutInstance(0, EngineSettings("x"), SamplingSettings(), admission="greedy")


def test_placement_pins_each_instance_to_its_own_devices():
    env, opts = instance_placement("cpu", 1, 1, 2, kv_cache_gib=1)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert opts["num_cpus"] == 1 and "resources" not in opts and opts["runtime_env"]["env_vars"] == env
    env, opts = instance_placement("npu", 1, 2, 8, kv_cache_gib=1)
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "2,3"
    assert opts["resources"] == {"NPU": 2} and opts["num_cpus"] == 1


def test_the_engine_processes_get_the_instances_core_binding_and_the_builder_keeps_its_own(monkeypatch):
    """CPU, uni executor: OpenMP is bound to the instance's cores only while its engine is spawned."""
    from asp_npu.device import engine_spawn_env, rollout_env

    for k, v in rollout_env("cpu", [2, 3], kv_cache_gib=1).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("OMP_PLACES", raising=False)
    with engine_spawn_env():
        assert os.environ["OMP_PLACES"] == "{2,3}" and os.environ["OMP_NUM_THREADS"] == "2"
        assert os.environ["OMP_PROC_BIND"] == "true"
    assert os.environ["OMP_NUM_THREADS"] == "1" and "OMP_PLACES" not in os.environ
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # vLLM's own worker process binds itself
    with engine_spawn_env():
        assert "OMP_PLACES" not in os.environ
