"""TrainQueue invariants: whole groups, nothing lost or duplicated, lag bound never exceeded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.core.train_queue import TrainQueue


def test_synchronous_when_max_lag_zero() -> None:
    q = TrainQueue(minibatch_groups=2, version_groups=4, max_lag=0)
    assert q.capacity(0, now=0.0) == 4
    for g in range(4):
        q.admit(g, 0, now=0.0)
    assert q.capacity(0, now=0.0) == 0
    for g in (3, 1, 2):
        q.put(g, samples=8, now=1.0)
    assert q.get(now=1.0) is not None  # groups 3, 1 (put order)
    h = q.get(now=1.0)
    assert h is None  # group 0 still running: the second minibatch of step 0 waits
    q.put(0, samples=8, now=2.0)
    h = q.get(now=2.0)
    assert h is not None and h.step == 0 and sorted(g.group_id for g in h.groups) == [0, 2]
    assert q.trainer_step == 1
    assert q.capacity(0, now=2.0) == 0  # instances still hold version 0 weights: nothing admissible
    assert q.capacity(1, now=2.0) == 4  # after the weight refresh: the next iteration


def test_errors() -> None:
    with pytest.raises(ValueError):
        TrainQueue(3, 4, 1)
    q = TrainQueue(1, 1, 0)
    q.admit("a", 0, now=0.0)
    with pytest.raises(RuntimeError):
        q.admit("b", 0, now=0.0)
    with pytest.raises(KeyError):
        q.put("b", samples=1, now=0.0)


def test_shortest_order_within_deadline() -> None:
    q = TrainQueue(1, 4, 1, order="shortest")
    for g, tok in (("long", 900), ("short", 10)):
        q.admit(g, 0, now=0.0)
        q.put(g, samples=1, tokens=tok, now=0.0)
    assert q.get(now=0.0).groups[0].group_id == "short"


def test_clock_injection_and_summary() -> None:
    t = [0.0]
    q = TrainQueue(1, 1, 1, clock=lambda: t[0])
    q.admit("a", 0)
    t[0] = 2.0
    q.put("a", samples=4, tokens=100)
    t[0] = 4.0
    h = q.get()
    assert h.t == 4.0 and h.lags == [0]
    s = q.summary()
    assert s["lag_max"] == 0 and s["queued_max"] == 1 and 0 < s["queued_mean"] < 1


ops = st.lists(
    st.tuples(st.sampled_from(["admit", "finish", "get", "refresh", "cancel"]), st.integers(0, 1000)),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(
    mb=st.integers(1, 3),
    mult=st.integers(1, 3),
    max_lag=st.integers(0, 3),
    program=ops,
    order=st.sampled_from(["fifo", "shortest"]),
    conc=st.one_of(st.none(), st.integers(1, 12)),
)
def test_invariants(mb, mult, max_lag, program, order, conc) -> None:
    V = mb * mult
    q = TrainQueue(mb, V, max_lag, max_concurrent_groups=conc, order=order)
    inst_version = 0  # weights the instances hold (<= trainer step)
    next_id = 0
    running: list[int] = []
    admitted: set[int] = set()
    consumed: list[int] = []
    cancelled: set[int] = set()
    now = 0.0
    for op, x in program:
        now += 1.0
        cap = q.capacity(inst_version, now=now)
        assert cap >= 0
        if op == "admit" and cap > 0:
            for _ in range(1 + x % cap):
                q.admit(next_id, inst_version, now=now)
                running.append(next_id)
                admitted.add(next_id)
                next_id += 1
        elif op == "finish" and running:
            g = running.pop(x % len(running))  # out of order completion
            q.put(g, samples=4, tokens=x, now=now)
        elif op == "cancel" and running:
            g = running.pop(x % len(running))
            q.cancel(g, now=now)
            cancelled.add(g)
        elif op == "get":
            h = q.get(now=now)
            if h is not None:
                assert len(h.groups) == mb  # complete minibatches of whole groups
                assert all(0 <= lag <= max_lag for lag in h.lags)
                consumed.extend(g.group_id for g in h.groups)
        elif op == "refresh":
            inst_version = q.trainer_step
    # drain: finish everything, then every complete minibatch must be handed out (no deadlock)
    for g in running:
        q.put(g, samples=4, now=now)
    while q.n_queued >= mb:
        h = q.get(now=now)
        assert h is not None, "all groups finished but a full minibatch was refused"
        assert all(0 <= lag <= max_lag for lag in h.lags)
        consumed.extend(g.group_id for g in h.groups)
    assert len(consumed) == len(set(consumed))  # never duplicated
    assert set(consumed) <= admitted - cancelled
    assert len(consumed) + q.n_queued == len(admitted) - len(cancelled)  # never lost
    assert q.n_in_flight == 0
