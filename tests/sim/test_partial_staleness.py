"""Partial rollout's lag rule (`asp_npu.core.staleness`, `TrainQueue.restamp`) under random programs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.core.staleness import group_deadline, restamp_deadline, token_lags_ok
from asp_npu.core.train_queue import TrainQueue


def test_rule_by_hand() -> None:
    assert group_deadline(3, 3, 2) == 5
    assert group_deadline(3, 6, 2, max_token_lag=4) == 7  # the oldest token binds
    assert group_deadline(3, 4, 2, max_token_lag=4) == 6  # the newest binds
    # not started: both stamps move (no semantic change); started without partial rollout: nothing moves
    assert restamp_deadline(1, 1, 3, False, 2, None) == (3, 3, 5)
    assert restamp_deadline(1, 1, 3, True, 2, None) == (1, 1, 3)
    assert restamp_deadline(1, 1, 3, True, 2, 4) == (1, 3, 5)
    with pytest.raises(ValueError):
        restamp_deadline(2, 3, 1, True, 2, 4)
    assert token_lags_ok(7, 3, 6, 2, 4) and not token_lags_ok(8, 3, 6, 2, 4)
    with pytest.raises(ValueError):
        TrainQueue(1, 1, max_lag=2, max_token_lag=1)


ops = st.lists(
    st.tuples(st.sampled_from(["admit", "start", "finish", "get", "refresh", "cancel"]),
              st.integers(0, 1000)),
    max_size=150,
)


@settings(max_examples=300, deadline=None)
@given(
    mb=st.integers(1, 3),
    mult=st.integers(1, 3),
    max_lag=st.integers(0, 3),
    extra=st.one_of(st.none(), st.integers(0, 3)),
    program=ops,
)
def test_no_token_beyond_max_token_lag_no_group_beyond_max_lag(mb, mult, max_lag, extra, program) -> None:
    """Admit, start, refresh (re-stamping every group in flight), finish out of order, hand out:
    every handout keeps newest-version lag <= max_lag and oldest-token lag <= max_token_lag; nothing
    lost, nothing duplicated, no deadlock once everything finished."""
    V = mb * mult
    tok = None if extra is None else max_lag + extra
    q = TrainQueue(mb, V, max_lag, max_token_lag=tok)
    inst_version = 0
    nid = 0
    running: dict[int, tuple[int, bool]] = {}  # group -> (first-token version or -1, started)
    consumed: list[int] = []
    admitted: set[int] = set()
    cancelled: set[int] = set()
    now = 0.0

    def check(h) -> None:
        for g in h.groups:
            oldest = g.version if g.oldest_version is None else g.oldest_version
            assert 0 <= h.step - g.version <= max_lag
            assert 0 <= h.step - oldest <= (max_lag if tok is None else tok)
            assert oldest == first[g.group_id]  # the stamp is the version of its first token

    first: dict[int, int] = {}
    for op, x in program:
        now += 1.0
        cap = q.capacity(inst_version, now=now)
        assert cap >= 0
        if op == "admit" and cap > 0:
            for _ in range(1 + x % cap):
                q.admit(nid, inst_version, now=now)
                running[nid] = (-1, False)
                admitted.add(nid)
                nid += 1
        elif op == "start" and running:
            g = sorted(running)[x % len(running)]
            if not running[g][1]:
                running[g] = (inst_version, True)
        elif op == "finish" and running:
            g = sorted(running)[x % len(running)]
            v, started = running.pop(g)
            first[g] = v if started else q._in_flight[g][0]  # a group that never waited starts on its stamp
            q.put(g, samples=4, now=now)
        elif op == "cancel" and running:
            g = sorted(running)[x % len(running)]
            running.pop(g)
            q.cancel(g, now=now)
            cancelled.add(g)
        elif op == "get":
            h = q.get(now=now)
            if h is not None:
                check(h)
                consumed.extend(g.group_id for g in h.groups)
        elif op == "refresh" and q.trainer_step > inst_version:
            inst_version = q.trainer_step
            for g, (_, started) in running.items():
                q.restamp(g, inst_version, started=started, now=now)
    for g in list(running):
        v, started = running.pop(g)
        first[g] = v if started else q._in_flight[g][0]
        q.put(g, samples=4, now=now)
    while q.n_queued >= mb:
        h = q.get(now=now)
        assert h is not None, "all groups finished but a full minibatch was refused"
        check(h)
        consumed.extend(g.group_id for g in h.groups)
    assert len(consumed) == len(set(consumed))
    assert len(consumed) + q.n_queued == len(admitted) - len(cancelled)
    assert q.n_in_flight == 0
