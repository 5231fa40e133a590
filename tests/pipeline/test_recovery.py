"""Failure policy without Ray: lost instances and failed requests never lose or duplicate a group."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.core.feed import PullFeed, StaticFeed
from asp_npu.core.modes import mode_spec
from asp_npu.core.policy import DispatchPolicy, Ports
from asp_npu.core.records import Unit
from asp_npu.core.recovery import Retries, Watchdog

ACTIONS = st.lists(st.tuples(st.sampled_from(["dispatch", "put", "read", "kill", "back", "fail"]),
                             st.integers(0, 10_000)), max_size=120)


def _world(instances: int, static: bool, windows: int = 3, per_window: int = 4, size: int = 2):
    feed = StaticFeed(instances) if static else PullFeed(instances)
    pol = DispatchPolicy(feed, mode_spec("asp"), instances, slots=4)
    for w in range(windows):
        pol.add_window([Unit(w * 100 + j, w, tuple(f"g{w}.{j}.{x}" for x in range(size)), 2,
                             j % instances if static else -1) for j in range(per_window)])
    return pol


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3), st.booleans(), ACTIONS, st.integers(0, 3))
def test_every_group_consumed_exactly_once_under_instance_deaths(instances, static, actions, max_retries):
    pol = _world(instances, static)
    planned = set(pol.group_unit)
    retries = Retries(max_retries)
    running: list[list[str]] = [[] for _ in range(instances)]  # groups an instance is generating
    put: list[str] = []  # in the queue, not yet read by the driver (the race with a death)
    in_queue: set[str] = set()  # admitted and not put (the TrainQueue's in-flight ledger)
    consumed: list[str] = []

    def submit(i: int, unit: Unit) -> None:
        running[i].extend(unit.groups)

    def admit(unit: Unit, i: int) -> bool:
        assert not in_queue & set(unit.groups), "a group admitted twice"
        in_queue.update(unit.groups)
        return True

    ports = Ports(admit, submit, lambda i, on: None)

    def cancel(groups: list[str]) -> list[str]:
        gone = [g for g in groups if g in in_queue]
        in_queue.difference_update(gone)
        return gone

    def lose(i: int) -> None:
        running[i] = []
        pol.redispatch(cancel(pol.lost(i)))

    for act, n in actions:
        live = [i for i in range(instances) if i not in pol.down]
        if act == "dispatch":
            pol.dispatch(ports)
        elif act == "put" and any(running[i] for i in live):
            i = [i for i in live if running[i]][n % len([i for i in live if running[i]])]
            g = running[i].pop(n % len(running[i]))
            in_queue.discard(g)
            put.append(g)
        elif act == "read" and put:
            g = put.pop(0)
            pol.arrived(g)
            consumed.append(g)
        elif act == "kill" and live:
            lose(live[n % len(live)])
        elif act == "back" and pol.down:
            pol.back(sorted(pol.down)[n % len(pol.down)])
        elif act == "fail" and any(running[i] for i in live):
            i = [i for i in live if running[i]][0]
            g = running[i].pop(n % len(running[i]))
            cancel([g])
            if retries.failed(g, "boom"):
                pol.redispatch([g])
            else:
                pol.arrived(g)  # given up: the driver stops the run; here it just leaves the ledger
    for i in sorted(pol.down):  # restart every lost instance and run to the end
        pol.back(i)
    for _ in range(200):
        pol.dispatch(ports)
        for i in range(instances):
            for g in running[i]:
                in_queue.discard(g)
                put.append(g)
            running[i] = []
        while put:
            g = put.pop(0)
            pol.arrived(g)
            consumed.append(g)
        if not pol.retry and not pol.feed.pending() and not any(pol.inflight):
            break
    given_up = set(retries.given_up)
    assert len(consumed) == len(set(consumed))
    assert set(consumed) | given_up == planned and not set(consumed) & given_up
    assert not in_queue and not pol.retry


def test_a_lost_instance_returns_only_undelivered_groups_and_takes_no_work():
    pol = _world(2, static=False, windows=1, per_window=2)
    sent: list[tuple[int, Unit]] = []
    ports = Ports(lambda u, i: True, lambda i, u: sent.append((i, u)), lambda i, on: None)
    pol.dispatch(ports)
    on0 = [u for i, u in sent if i == 0][0]
    pol.arrived(on0.groups[0])
    assert pol.lost(0) == [on0.groups[1]] and pol.down == {0}
    (retry,) = pol.redispatch([on0.groups[1]])
    sent.clear()
    pol.dispatch(ports)
    assert [(i, u.uid) for i, u in sent][:1] == [(1, retry.uid)] and all(i == 1 for i, _ in sent)
    pol.back(0)
    assert pol.room(0)


def test_retries_are_bounded_and_the_watchdog_spots_a_silent_busy_instance():
    r = Retries(max_retries=2)
    assert r.failed("g", "e1") and r.failed("g", "e2") and not r.failed("g", "e3")
    assert r.given_up == {"g": "e3"} and r.retried == 2
    w = Watchdog(2, timeout_s=10.0)
    assert w.hung([True, True], 1e9) == []  # the first look starts the clock
    w.progressed(0, 100.0)
    w.progressed(1, 100.0)
    assert w.hung([True, False], 105.0) == []
    assert w.hung([True, False], 111.0) == [0]  # instance 1 is idle: never hung
