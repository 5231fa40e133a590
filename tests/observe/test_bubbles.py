"""The one bubble accounting on hand-made event logs, and the Perfetto writer."""

from __future__ import annotations

import json

import pytest

from asp_npu.errors import UserError
from asp_npu.observe.bubbles import account
from asp_npu.observe.events import EventLog
from asp_npu.observe.timeline import chrome_trace, write_timeline


def two_instance_log() -> EventLog:
    """2 instances (1 device, 4 slots each) + a 2-device trainer over 10 s, numbers chosen by hand."""
    log = EventLog(devices=4, trainer_devices=2)
    log.add_instance(1, 4)
    log.add_instance(1, 4)
    log.instance_state(0.0, 0, 4, "run")  # 0-2: full
    log.instance_state(2.0, 0, 1, "drained")  # 2-6: 1 of 4 running: 0.75 padding
    log.instance_state(6.0, 0, 0, "drained")  # 6-10: empty; nobody generates -> sorting
    log.instance_state(0.0, 1, 2, "blocked")  # 0-4: 2 running, 2 blocked (sorting)
    log.instance_state(4.0, 1, 0, "drained")  # 4-6: empty while instance 0 runs -> skewness
    log.instance_state(6.0, 1, 0, "paused")  # 6-8: refresh -> overhead
    log.instance_state(8.0, 1, 0, "drained")  # 8-10: empty, nobody generates -> sorting
    log.trainer_state(0.0, "wait")  # 0-6
    log.trainer_state(6.0, "busy", 0.75)  # 6-10, a quarter padded
    return log


def test_hand_computed_buckets() -> None:
    b = account(two_instance_log(), 0.0, 10.0)
    total = 40.0
    useful = (4 / 4) * 2 + (1 / 4) * 4 + (2 / 4) * 4 + 2 * 4 * 0.75
    padding = (3 / 4) * 4 + 2 * 4 * 0.25
    skewness = 2.0
    sorting = 4.0 + (2 / 4) * 4 + 2.0 + 2 * 6
    overhead = 2.0
    assert b.utilization == pytest.approx(useful / total)
    assert b.padding == pytest.approx(padding / total)
    assert b.skewness == pytest.approx(skewness / total)
    assert b.sorting == pytest.approx(sorting / total)
    assert b.overhead == pytest.approx(overhead / total)
    assert b.utilization + b.padding + b.skewness + b.sorting + b.overhead == pytest.approx(1.0)
    assert b.coverage == pytest.approx(1.0)
    assert b.trainer_idle_ratio == pytest.approx(0.6)
    assert b.rollouter_idle_ratio == pytest.approx(1 - (2 + 1 + 2) / 20)


def test_window_and_colocated_lending() -> None:
    log = EventLog(devices=2, trainer_devices=2, colocated=True)
    log.add_instance(2, 2)
    log.instance_state(0.0, 0, 2, "run")
    log.instance_state(5.0, 0, 0, "lent")
    log.trainer_state(0.0, "lent")
    log.trainer_state(5.0, "busy", 1.0)
    b = account(log, 0.0, 10.0)
    assert b.utilization == pytest.approx(1.0) and b.coverage == pytest.approx(1.0)
    assert b.trainer_idle_ratio == pytest.approx(0.5)
    assert b.rollouter_idle_ratio == pytest.approx(0.5)  # the devices trained half the time
    half = account(log, 4.0, 6.0)
    assert half.device_seconds == pytest.approx(4.0)


def test_roundtrip_and_bad_logs(tmp_path) -> None:
    log = two_instance_log()
    p = tmp_path / "ev.json"
    log.write(p)
    again = EventLog.read(p)
    assert account(again, 0, 10).to_dict() == account(log, 0, 10).to_dict()
    bad = log.to_dict()
    bad["inst"] = [list(e) for e in bad["inst"]]
    bad["inst"][0][3] = "sleeping"
    with pytest.raises(UserError, match="unknown state"):
        EventLog.from_dict(bad)
    with pytest.raises(UserError, match="asp-events/1"):
        EventLog.from_dict({"schema": "x"})


def test_chrome_trace(tmp_path) -> None:
    log = two_instance_log()
    log.unit(0, "it0", 0.0, 6.0, 4)
    log.queue(1.0, 2, 3)
    log.version(6.0, 1)
    tr = chrome_trace(log, 0.0, 10.0)
    names = {e["args"]["name"] for e in tr["traceEvents"] if e["ph"] == "M"}
    assert {"rollout", "trainer", "instance 0", "instance 1 units"} <= names
    spans = [e for e in tr["traceEvents"] if e["ph"] == "X" and e["pid"] == 1 and e["tid"] == 2]
    assert [s["name"] for s in spans] == ["blocked", "drained", "paused", "drained"]
    assert sum(s["dur"] for s in spans) == pytest.approx(10e6)
    assert any(e["ph"] == "C" and e["name"] == "groups" for e in tr["traceEvents"])
    p = tmp_path / "t.json"
    write_timeline(p, log, 2.0, 8.0)
    doc = json.loads(p.read_text())
    assert all(e.get("ts", 0) >= 0 for e in doc["traceEvents"])
