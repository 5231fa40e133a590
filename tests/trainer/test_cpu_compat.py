"""The trainer installs its CPU shim itself, on CPU only (device.py never imports it)."""

from __future__ import annotations

import pytest

from asp_npu.trainer import cpu_compat


@pytest.mark.parametrize("kind, installs", [("cpu", 1), ("npu", 0), ("cuda", 0)])
def test_prepare_installs_the_shim_on_cpu_only(monkeypatch, kind, installs) -> None:
    calls: list[None] = []
    monkeypatch.setattr(cpu_compat, "install", lambda: calls.append(None))
    cpu_compat.prepare(kind)
    assert len(calls) == installs
