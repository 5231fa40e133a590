"""Partial rollout in the real pipeline, the pure parts: per-token behaviour versions as the engine
records them, the restamps the TrainQueue actor applies (the simulator's rule in
`asp_npu.core.staleness`), and `bench real --partial-rollout`'s naming. The real engines and trainer
run in `test_e2e.py` (slow)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.core.staleness import group_deadline, reconcile_stamp, token_lag_bound
from asp_npu.core.train_queue import TrainQueue
from asp_npu.pipeline.bench import _mode_config, partial_table, with_partial
from asp_npu.pipeline.queue_actor import QueueService
from asp_npu.rollout.vllm_engine import SeqVersions, group_status, internal_to_external
from asp_npu.types import Trajectory


def _traj(pid: str, idx: int, n: int, changes: list[list[int]]) -> Trajectory:
    return Trajectory(pid, idx, [1, 2], list(range(n)), [0.0] * n, "length", 0.0, changes[0][1], instance=0,
                      policy_version_last=changes[-1][1], version_changes=changes)


def test_a_group_waiting_at_a_refresh_is_stamped_when_it_starts_not_when_admitted():
    """The lag counts today: group B admitted under v0, no token yet when v1 goes live. Stamped with v0
    (its admission) it is due at step 1, so the trainer must wait for it although C (v1) is ready;
    stamped with v1 (the version its first token really has) step 1 takes C."""
    def scenario(restamp: bool):
        q = TrainQueue(1, 1, max_lag=1)
        for g in ("A", "B"):
            q.admit(g, 0)
        q.put("A", 4)
        assert q.get().step == 0
        if restamp:
            q.restamp("B", 1, started=False)
        q.admit("C", 1)
        q.put("C", 4)
        return q.get()

    assert scenario(restamp=False) is None  # refused: B (due at step 1) is still generating
    h = scenario(restamp=True)
    assert h is not None and h.step == 1 and [g.group_id for g in h.groups] == ["C"]


def test_seq_versions_split_tokens_at_the_workers_count():
    s = SeqVersions("p/0/0", [[0, 0]])
    assert s.new_weights(1, (5, False)) and s.points == [[0, 0], [5, 1]]
    assert not s.new_weights(2, (9, True)) and s.points == [[0, 0], [5, 1]]  # its last token ended it
    assert s.changes(9) == [[0, 0], [5, 1]] and s.changes(5) == [[0, 0]]
    w = SeqVersions("p/1/1", [[0, 0]])
    assert w.new_weights(1, None) and w.points == [[0, 1]]  # not scheduled yet: starts with v1
    z = SeqVersions("p/2/2", [[0, 0]])
    assert z.new_weights(1, (0, False)) and z.points == [[0, 1]]
    d = SeqVersions("p/3/3", [[0, 0]], done=True)
    assert not d.new_weights(1, None) and d.points == [[0, 0]]  # finished before the load
    q = SeqVersions()  # not submitted: it takes the version live when it is
    assert q.new_weights(1, None) and q.points == []
    assert internal_to_external({"p@0/3/17-1a2b3c4d": (4, False)}) == {"p@0/3/17": (4, False)}
    assert group_status(False, True) == "waiting" and group_status(True, True) == "running"
    assert group_status(True, False) == "done"


def test_trajectory_token_versions():
    t = _traj("p", 0, 7, [[0, 3], [2, 4], [6, 6]])
    assert t.token_versions() == [3, 3, 4, 4, 4, 4, 6]
    assert t.version_segments() == [(3, 2), (4, 4), (6, 1)]
    old = Trajectory("p", 0, [1], [5, 6], [0.0, 0.0], "stop", 0.0, 2)  # recorded before change points
    assert old.token_versions() == [2, 2] and old.changes() == [[0, 2]]


@settings(deadline=None)
@given(st.integers(0, 5), st.integers(0, 3), st.integers(0, 5), st.integers(0, 3), st.booleans(),
       st.integers(1, 3), st.integers(0, 4))
def test_reconcile_only_moves_a_deadline_later(o, dn, ro, drn, partial, max_lag, extra):
    stamp, rec = (o, o + dn), (ro, ro + drn)
    tl = max_lag + extra if partial else None
    q = TrainQueue(1, 1, max_lag, max_token_lag=tl)
    q.admit("g", stamp[0])
    if stamp[1] > stamp[0]:
        q.restamp("g", stamp[1], started=partial)
    before = q.stamp("g")
    assert before is not None
    d0 = group_deadline(before[0], before[1], max_lag, tl)
    for v, started in reconcile_stamp(before, rec, partial):
        q.restamp("g", v, started=started)
    after = q.stamp("g")
    assert after is not None and group_deadline(after[0], after[1], max_lag, tl) >= d0
    if rec[0] >= before[1] and rec[0] > before[0]:  # started later than stamped: stamped with its start
        assert after[0] == rec[0]


def test_queue_actor_restamps_by_instance_and_reconciles_at_put():
    async def scenario(partial: bool):
        qs = QueueService(1, 2, max_lag=1, group_size=2, steps_per_version=2,
                          max_token_lag=token_lag_bound(partial, None, 1))
        assert await qs.admit(["w", "r", "x"], 0, instance=0)
        assert await qs.admit(["other"], 0, instance=1)
        await qs.restamp(0, 2, waiting=["w", "other"], running=["r"])  # weights step 2 = ledger v1
        stamps = {g: qs.queue.stamp(g) for g in ("w", "r", "x", "other")}
        # x's refresh reached its instance before x did: its tokens say v1 (weights step 2), onwards v2
        await qs.put_group([_traj("x", i, 6, [[0, 2], [3, 4]]) for i in range(2)])
        x = qs.queue._queued  # the queued group's stamp
        (qg,) = [item[2] for heap in x.values() for item in heap]
        return stamps, qg, dict(qs.restamps)

    stamps, qg, counts = asyncio.run(scenario(partial=False))
    assert stamps == {"w": (1, 1), "r": (0, 0), "x": (0, 0), "other": (0, 0)}  # another instance's: no
    assert (qg.version, qg.oldest_version) == (1, None)
    assert counts == {"waiting": 1, "running": 0, "at_put": 1}
    stamps, qg, counts = asyncio.run(scenario(partial=True))
    assert stamps["r"] == (0, 1) and stamps["w"] == (1, 1)
    assert (qg.version, qg.oldest_version) == (2, 1) and counts == {"waiting": 1, "running": 1, "at_put": 2}


def test_bench_runs_each_asynchronous_mode_off_and_on(tmp_path):
    from asp_npu.config import Config

    assert with_partial(["asp", "mindspeed-sync", "async-fifo"]) == [
        "asp", "asp+partial", "mindspeed-sync", "async-fifo", "async-fifo+partial"]
    cfg = _mode_config(Config(), "asp+partial", 7, tmp_path)
    assert cfg.rl_config.mode == "asp" and cfg.rl_config.partial_rollout
    assert cfg.trainer.run_dir.endswith("asp+partial_s7")
    assert not _mode_config(Config(), "asp", 7, tmp_path).rl_config.partial_rollout
    row = {"throughput_tokens_per_s": 100.0, "iteration_time_mean_s": 2.0, "lag_newest_max": 1,
           "max_lag": 2, "token_lag_max": 1, "max_token_lag": 2, "token_lag_hist": {"0": 3, "1": 1},
           "partial_rollout": False}
    text = partial_table({"asp": row, "asp+partial": {**row, "partial_rollout": True,
                                                      "throughput_tokens_per_s": 120.0}})
    assert "| asp | on | 120 | +20.0% |" in text and "0: 75.0%, 1: 25.0%" in text
