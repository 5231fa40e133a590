"""Pure logic of the pipeline (no engines): window stream, queue actor, event log, bench table."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.core.records import GroupKey
from asp_npu.core.shape import RunShape
from asp_npu.core.window import window_stream
from asp_npu.observe.bubbles import account
from asp_npu.pipeline.bench import aggregate, table
from asp_npu.pipeline.modes import SPECS, instance_count, mode_spec
from asp_npu.pipeline.queue_actor import QueueService
from asp_npu.pipeline.real_events import InstanceRecord, TrainerRecord, build_event_log, instance_states
from asp_npu.types import PromptItem, Trajectory


def _prompts(n: int) -> list[PromptItem]:
    return [PromptItem(f"p{i}", text=f"q{i}", ground_truth=str(i)) for i in range(n)]


@given(n=st.integers(1, 30), window=st.integers(1, 12), windows=st.integers(1, 8), seed=st.integers(0, 99))
@settings(max_examples=60, deadline=None)
def test_window_stream_covers_each_epoch_once(n, window, windows, seed):
    get = window_stream(_prompts(n), window, seed)
    items = [it for w in range(windows) for it in get(w)]
    ids = [it.prompt_id for it in items]
    assert len(ids) == len(set(ids)) == window * windows  # unique group ids across the run
    for it in items:
        key = GroupKey.parse(it.prompt_id)
        assert it.meta["base_id"] == key.prompt_id and it.meta["epoch"] == key.epoch
    by_epoch: dict[int, list[str]] = {}
    for it in items:
        by_epoch.setdefault(it.meta["epoch"], []).append(it.meta["base_id"])
    for epoch, bases in by_epoch.items():
        assert len(bases) == len(set(bases))  # a prompt appears at most once per epoch
        if (epoch + 1) * n <= len(items):
            assert sorted(bases) == sorted(f"p{i}" for i in range(n))
    assert [it.prompt_id for it in window_stream(_prompts(n), window, seed)(0)] == ids[:window]


def _group(gid: str, version: int, n: int = 2, length: int = 3) -> list[Trajectory]:
    return [Trajectory(gid, k, [1, 2], [5] * length, [-0.1] * length, "stop", 1.0, version, instance=0)
            for k in range(n)]


def test_queue_service_admits_whole_units_and_bounds_lag():
    async def scenario():
        q = QueueService(minibatch_groups=2, version_groups=2, max_lag=1, group_size=2)
        assert await q.capacity(0) == 4  # (max_lag + 0 + 1) * 2 groups
        assert not await q.admit(["a", "b", "c", "d", "e"], 0)  # all or none
        assert (await q.state())["in_flight"] == 0
        assert await q.admit(["a", "b", "c"], 0)
        assert await q.capacity(0) == 1
        await q.put_group(_group("a", 0))
        assert await q.get_batch(0.0) is None  # a minibatch holds two whole groups
        waiter = asyncio.ensure_future(q.get_batch(5.0))
        await asyncio.sleep(0.01)
        await q.put_group(_group("b", 0, length=4))
        got = await waiter
        assert got.step == 0 and sorted(got.groups) == ["a", "b"] and len(got.trajectories) == 4
        arrivals, _, _ = await q.wait_arrivals(0, 0.0)
        assert [r.group for r in arrivals] == ["a", "b"] and arrivals[1].lens == (4, 4)
        assert arrivals[0].prompt_len == 2
        series = await q.series()
        assert series["lags"] == [0, 0] and series["summary"]["consumed_groups"] == 2.0
        assert await q.wait_arrivals(2, 0.01) == ([], 0, [])
        # the controller blocks on arrivals; a wake (trainer step done) ends the wait at once, and a
        # wake that came before the wait started is not lost (its count is already past `wakes_seen`)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        arrivals_waiter = asyncio.ensure_future(q.wait_arrivals(2, 5.0, 0))
        batch_waiter = asyncio.ensure_future(q.get_batch(0.3))
        await asyncio.sleep(0.01)
        assert await q.wake() == 1
        assert await arrivals_waiter == ([], 1, []) and loop.time() - t0 < 1.0
        assert await batch_waiter is None  # woken too, found nothing, kept waiting until its timeout
        assert (await q.wait_arrivals(2, 5.0, 0))[1] == 1 and loop.time() - t0 < 1.0
        await q.put_group(_group("zzz", 0))  # never admitted: dropped and counted, never queued
        assert (await q.state())["stale_puts"] == 1 and (await q.state())["arrivals"] == 2

    asyncio.run(scenario())


def test_queue_service_cancels_a_lost_instances_groups_and_drops_its_late_puts():
    async def scenario():
        q = QueueService(minibatch_groups=2, version_groups=2, max_lag=1, group_size=2)
        assert await q.admit(["a", "b"], 0, instance=0)
        await q.put_group(_group("a", 0))  # instance 0 delivered `a`, then died
        assert await q.cancel(["a", "b"]) == ["b"]  # `a` arrived: not cancelled, not re-dispatched
        assert (await q.state())["in_flight"] == 0
        assert await q.admit(["b"], 0, instance=1)
        await q.put_group(_group("b", 0))  # a late put from the lost instance 0
        assert (await q.state())["stale_puts"] == 1 and (await q.state())["arrivals"] == 1
        waiter = asyncio.ensure_future(q.wait_arrivals(1, 5.0, None, 0))
        await q.group_failed("b", 0, "not its owner")  # ignored
        await q.group_failed("b", 1, "boom")
        assert await waiter == ([], 0, [("b", 1, "boom")])

    asyncio.run(scenario())


def test_instance_states_priorities():
    stats = {
        "sequence_events": [{"event": "start", "t": 1.0}, {"event": "start", "t": 1.0},
                            {"event": "finish", "t": 2.0}, {"event": "finish", "t": 3.0}],
        "unit_events": [{"event": "unit_start", "t": 1.0, "unit": 0, "samples": 2},
                        {"event": "unit_finish", "t": 3.0, "unit": 0}],
    }
    rec = InstanceRecord(paused=[(3.5, 4.0)])
    rec.set_blocked(4.0, True)
    rec.set_blocked(5.0, False)
    got = instance_states(stats, rec, 0.0, 6.0)
    assert got == [(0.0, 0, "drained"), (1.0, 2, "run"), (2.0, 1, "run"), (3.0, 0, "drained"),
                   (3.5, 0, "paused"), (4.0, 0, "blocked"), (5.0, 0, "drained")]


def test_event_log_accounts_every_device_second():
    stats = [
        {"sequence_events": [{"event": "start", "t": 0.0}, {"event": "finish", "t": 4.0}],
         "unit_events": [{"event": "unit_start", "t": 0.0, "unit": 0, "samples": 1},
                         {"event": "unit_finish", "t": 4.0, "unit": 0}]},
        {"sequence_events": [{"event": "start", "t": 0.0}, {"event": "finish", "t": 1.0}],
         "unit_events": [{"event": "unit_start", "t": 0.0, "unit": 1, "samples": 1},
                         {"event": "unit_finish", "t": 1.0, "unit": 1}]},
    ]
    tr = TrainerRecord(busy=[(4.0, 6.0)])
    log = build_event_log(stats, [InstanceRecord(), InstanceRecord()], tr, slots=1, trainer_devices=1,
                          colocated=False, t0=0.0, t1=6.0)
    rep = account(log, 0.0, 6.0)
    assert rep.coverage == pytest.approx(1.0)
    total = rep.utilization + rep.padding + rep.skewness + rep.sorting + rep.overhead
    assert total == pytest.approx(1.0)
    # instance 1 idles 3 s while instance 0 still generates: skewness = 3 of 18 device-seconds
    assert rep.skewness == pytest.approx(3 / 18)
    assert rep.trainer_idle_ratio == pytest.approx(4 / 6)


def test_mode_specs():
    assert set(SPECS) == {"asp", "async-fifo", "one-step-off", "sortedrl", "mindspeed-sync"}
    assert mode_spec("mindspeed-sync").colocated and mode_spec("asp").planner == "asp"
    from asp_npu.config import Config

    cfg = Config()
    cfg.rl_config.mini_batch_size, cfg.rl_config.n_samples_per_prompt = 32, 8
    cfg.rl_config.global_batch_size = 16
    assert RunShape.from_config(cfg, mode=mode_spec("mindspeed-sync")).steps_per_version == 4
    shape = RunShape.from_config(cfg, mode=mode_spec("asp"))
    assert (shape.steps_per_version, shape.steps_per_window, shape.version_groups) == (1, 4, 4)
    with pytest.raises(Exception, match="verl-sync"):
        mode_spec("verl-sync")
    # the admission setting picks ASP's dispatch; fixed-admission modes ignore it
    assert mode_spec("asp", "continuous").dispatch == "stream"
    assert mode_spec("asp", "unit").dispatch == "static" and mode_spec("asp", "unit").admission == "unit"
    assert mode_spec("async-fifo", "continuous").dispatch == "pull"
    assert mode_spec("mindspeed-sync", "unit").admission == "continuous"


def test_colocated_modes_generate_on_every_device():
    from asp_npu.config import Config

    cfg = Config()
    cfg.generate_config.num_instances, cfg.generate_config.infer_tensor_parallel_size = 1, 2
    sync, asp = mode_spec("mindspeed-sync").colocated, mode_spec("asp").colocated
    assert instance_count(cfg, sync, devices=8) == 4  # 8 devices / infer TP 2
    assert instance_count(cfg, asp, devices=8) == 1  # asynchronous: as configured
    cfg.generate_config.num_instances = 6
    assert instance_count(cfg, sync, devices=8) == 6  # never fewer than configured


def test_bench_aggregate_and_table():
    def run(tps, reward, seed):
        return {"throughput_tokens_per_s": tps, "iteration_time_mean_s": 100 / tps, "step_time_mean_s": 1.0,
                "final_reward": reward, "reward_curve": [0.1, reward], "lag_max": 1, "max_lag": 1,
                "bubbles": {"utilization": 0.5, "padding": 0.5}, "trainer_idle_ratio": 0.2,
                "rollouter_idle_ratio": 0.3, "samples": 64, "seed": seed, "run_dir": f"r{seed}"}

    agg = aggregate({"asp": [run(300.0, 0.5, 1), run(330.0, 0.6, 2)],
                     "mindspeed-sync": [run(150.0, 0.55, 1), run(160.0, 0.5, 2)]})
    assert agg["asp"]["throughput_tokens_per_s"] == 315.0
    assert agg["asp"]["speedup_vs_mindspeed_sync"] == pytest.approx(315 / 155)
    assert agg["asp"]["reward_curve"] == pytest.approx([0.1, 0.55])
    assert agg["asp"]["reward_within_spread"] is True
    text = table(agg)
    assert "| asp | 315 | 2.03x |" in text and "| mindspeed-sync | 155 | 1.00x |" in text


def test_weight_transfer_defaults_to_the_transfer_engine_and_refuses_unknown_paths():
    from asp_npu.config import Config, validate
    from asp_npu.weights.refresh import ObjectStoreWeights, make_weights

    cfg = Config()
    assert cfg.generate_config.weight_transfer == "auto"  # vLLM's weight-transfer engine
    assert not [p for p in validate(cfg) if "weight_transfer" in p]
    cfg.generate_config.weight_transfer = "object-store"  # the fallback without a process group
    assert not [p for p in validate(cfg) if "weight_transfer" in p]
    cfg.generate_config.weight_transfer = "nccl"
    assert [p for p in validate(cfg) if p.startswith("generate_config.weight_transfer: 'nccl'")]
    w = make_weights("object-store", None, [], "float32", True)
    assert isinstance(w, ObjectStoreWeights) and w.describe() == {"path": "object-store"}
