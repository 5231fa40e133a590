"""What a checkpoint carries, without engines: the TrainQueue's snapshot, the predictor's state and
the checkpoint pointer's refusals (the real runs: tests/pipeline/test_resume.py)."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.core.train_queue import TrainQueue
from asp_npu.errors import ConfigError
from asp_npu.pipeline.resume import Stopped
from asp_npu.predict.factory import make_predictor
from asp_npu.trainer.checkpoint import SCHEMA, commit_checkpoint, read_meta


def _drive(q: TrainQueue, ops: list[int], start: int, t0: float) -> list[tuple[int, list[str]]]:
    """Apply ops (0: admit+put one new group at the newest admissible version, 1: take a minibatch);
    returns the handouts as (step, group ids)."""
    out = []
    for n, op in enumerate(ops):
        now = t0 + n
        if op == 0:
            v = q.trainer_step
            if q.capacity(v) > 0:
                gid = f"g{start + n}"
                q.admit(gid, v, now)
                q.put(gid, samples=4, tokens=(start + n) % 7 + 1, now=now, payload=[gid])
        else:
            h = q.get(now)
            if h is not None:
                out.append((h.step, [g.group_id for g in h.groups]))
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=1, max_size=40), st.lists(st.integers(0, 1), max_size=40),
       st.sampled_from(["fifo", "shortest"]), st.integers(0, 2))
def test_a_restored_queue_hands_out_what_the_original_would(before, after, order, max_lag):
    """Snapshot mid-run, restore into a fresh queue: the same operations give the same handouts."""
    a = TrainQueue(2, 4, max_lag, order=order)
    _drive(a, before, 0, 0.0)
    consumed, queued = a.snapshot()
    b = TrainQueue(2, 4, max_lag, order=order)
    b.restore(consumed, queued, 100.0)
    assert (b.consumed, b.n_queued, b.trainer_step) == (a.consumed, a.n_queued, a.trainer_step)
    for v in range(a.trainer_step, a.trainer_step + 3):
        assert b.capacity(v) == a.capacity(v)
    assert _drive(b, after, 1000, 200.0) == _drive(a, after, 1000, 200.0)


def test_restore_needs_a_fresh_queue():
    q = TrainQueue(1, 1, 1)
    q.admit("g", 0, 0.0)
    with pytest.raises(RuntimeError):
        q.restore(0, [])


@pytest.mark.parametrize("name", ["history", "prompt-len", "oracle"])
def test_a_restored_predictor_predicts_the_same(name):
    rng = np.random.default_rng(0)
    p = make_predictor(name)
    ids = np.array([f"p{i % 20}" for i in range(200)])
    p.observe_many(ids, np.arange(200) // 40, rng.integers(5, 400, 200), rng.integers(3, 60, 200))
    p.observe("p3", 5, 77, 12)
    if name == "oracle":
        p.reveal(ids[:20], rng.integers(5, 400, 20))
    q = make_predictor(name)
    q.load_state_dict(p.state_dict())
    probe, plens = np.array([f"p{i}" for i in range(25)]), rng.integers(3, 60, 25)
    a, b = p.predict_many(probe, plens), q.predict_many(probe, plens)
    for col in ("mean", "q50", "q90", "source"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col


def _iteration(root, step, meta=None):
    it = root / f"iter_{step:07d}"
    it.mkdir(parents=True)
    m = meta or {"schema": SCHEMA, "iteration": it.name, "step": step}
    (it / "trainer.json").write_text(json.dumps(m))
    return it


def test_the_pointer_commits_a_complete_iteration_and_a_torn_one_is_refused(tmp_path):
    root = tmp_path / "ckpt"
    old = _iteration(root, 4)
    commit_checkpoint(root, old, pipeline="pipeline.pkl")
    assert read_meta(root)["path"] == str(old) and read_meta(root)["pipeline"] == "pipeline.pkl"
    (root / "iter_0000008" / "dist").mkdir(parents=True)  # a save that died before its trainer.json
    (root / "latest.json").write_text(json.dumps({"schema": SCHEMA, "iteration": "iter_0000008", "step": 8}))
    with pytest.raises(ConfigError, match="incomplete or missing; the newest complete one is .*iter_0000004"):
        read_meta(root)
    (root / "latest.json").write_text('{"schema": "asp-trai')  # torn
    with pytest.raises(ConfigError, match=r"torn or unreadable .*actor_config.load=.*iter_0000004"):
        read_meta(root)
    assert read_meta(old)["step"] == 4  # a complete iteration loads by itself
    with pytest.raises(ConfigError, match="holds no trainer checkpoint"):
        read_meta(tmp_path / "nothing")


def test_stopped_names_the_checkpoint_and_how_to_resume(tmp_path):
    s = Stopped("SIGTERM", 5, tmp_path / "iter_0000005", tmp_path)
    assert s.exit_code == 128 + signal.SIGTERM and Stopped("SIGINT", 1, tmp_path, tmp_path).exit_code == 130
    assert f"actor_config.load={tmp_path}" in str(s) and "step 5" in str(s)


def test_only_a_trainer_ranks_failure_restarts_the_run():
    from asp_npu.pipeline.resume import trainer_failure
    from asp_npu.remote import ActorLost, ActorTimeout

    dead = ActorLost("trainer rank 1", "trainer rank 1 died (train_step)")
    assert trainer_failure(dead) is dead
    assert trainer_failure(ActorTimeout("trainer rank 0", "no answer")) is not None  # a hung rank
    assert trainer_failure(ActorLost("rollout instance 0", "died")) is None  # recovery.py's job
    assert trainer_failure(ValueError("x")) is None


def test_a_restart_resumes_from_the_last_checkpoint_or_where_the_run_started(tmp_path):
    from asp_npu.config import load_config
    from asp_npu.core import run_dir as rd
    from asp_npu.pipeline.derived import RunDerived
    from asp_npu.pipeline.train import restart_point

    run = rd.RunDir(tmp_path / "run")
    run.checkpoints.mkdir(parents=True)
    cfg = load_config(None, ["actor_config.load=/elsewhere", "model.warm_start_steps=5"])
    started = RunDerived.at_start(cfg).with_policy("/run/warm_start", "warm_start")
    again = restart_point(cfg, started, run)
    assert again.resume_from == "/elsewhere" and again.policy_path == "/run/warm_start"
    commit_checkpoint(run.checkpoints, _iteration(run.checkpoints, 2))
    assert restart_point(cfg, again, run).resume_from == str(run.checkpoints)
    assert cfg.actor_config.load == "/elsewhere"  # the caller's config is not changed
