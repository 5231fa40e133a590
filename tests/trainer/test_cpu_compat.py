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


def test_emulated_device_counts_cpu_tensors_as_device_except_host_copies() -> None:
    """What megatron's HybridDeviceOptimizer sees while it sorts parameters on a CPU-only torch: the
    model's tensors are device tensors, `.cpu().pin_memory()` clones are host copies (and stay host
    through detach/clone/float), `.to("cuda")` lands on the CPU; torch is untouched afterwards."""
    import torch

    before = {n: torch.Tensor.__dict__.get(n) for n in cpu_compat._EMULATED}
    weight = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    with cpu_compat._emulated_device():
        host = weight.detach().clone().cpu().pin_memory()
        master = weight.detach().clone().float()
        assert weight.is_cuda and master.is_cuda  # stays on the "device"
        assert not host.is_cuda and not host.detach().clone().float().is_cuda
        assert host.data_ptr() != weight.data_ptr()  # a real copy
        assert weight.to("cuda").device.type == "cpu"
    assert {n: torch.Tensor.__dict__.get(n) for n in cpu_compat._EMULATED} == before
    assert not weight.is_cuda
