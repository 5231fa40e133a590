"""Run megatron-core on a CPU-only torch build (gloo): map its few direct CUDA calls to the CPU.

megatron-core assumes CUDA in a handful of places: `torch.cuda.current_device()` as a tensor device,
the CUDA RNG state for its model-parallel RNG tracker, stream/event/synchronize calls, and a few
`device="cuda"` literals (`torch.zeros(..., device="cuda")`, `tensor.cuda()`), and its optimizer
sorts parameters by `tensor.type() == 'torch.cuda.FloatTensor'`. This module maps them
to CPU equivalents (wrapping the torch factory functions rather than a TorchFunctionMode, because a
mode is thread-local and Ray may run actor methods on another thread). The trainer calls
`prepare(kind)` right after `asp_npu.device.prepare_megatron(kind)`: it installs the shim on CPU only,
so NPU/CUDA runs never patch anything. It also lets megatron's HybridDeviceOptimizer
(`actor_config.optimizer_cpu_offload`) run on CPU (`_emulated_device`). This module is the one
place (besides device.py) allowed to know the device kind; the device layer never imports it (the
arrow points from the trainer down).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

import torch

_INSTALLED = False


class _InertStream:
    """Stands in for torch.cuda.Stream: CPU work is synchronous, so every operation is a no-op."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_event(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record_event(self, *args: Any, **kwargs: Any) -> _InertEvent:
        return _InertEvent()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _InertEvent:
    """Stands in for torch.cuda.Event."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait(self, *args: Any, **kwargs: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: Any) -> float:
        return 0.0


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return False


_FACTORIES = ("zeros", "ones", "empty", "full", "tensor", "arange", "rand", "randn", "randint", "as_tensor")


def _cpu_factory(fn: Any) -> Any:
    """Wrap a torch factory so `device="cuda"` (megatron's literals) lands on the CPU, and its
    `pin_memory=True` (staging for a host-to-device copy that does not happen here) is dropped."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        kwargs.pop("pin_memory", None)
        return fn(*args, **kwargs)

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def _cpu_rng_get(device: Any = "cuda", clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    state = torch.get_rng_state()
    return state.clone() if clone else state


def _cpu_rng_set(new_state: torch.Tensor, device: Any = -1, graph_safe: bool = False) -> None:
    torch.set_rng_state(new_state)


_TENSOR_TYPE = torch.Tensor.type


def _megatron_tensor_type(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False,
                          **kwargs: Any) -> Any:
    """`tensor.type()` as megatron's optimizer expects it ('torch.cuda.FloatTensor' ...) when megatron
    asks about a CPU tensor; every other caller and every conversion get torch's own answer."""
    if dtype is not None or kwargs:
        return _TENSOR_TYPE(self, dtype, non_blocking, **kwargs)
    name = _TENSOR_TYPE(self)
    caller = sys._getframe(1).f_globals.get("__name__", "")
    if self.device.type == "cpu" and name.startswith("torch.") and caller.startswith("megatron."):
        return "torch.cuda." + name[len("torch."):]
    return name


class _DropForkWarning(logging.Filter):
    """On CPU megatron's "CUDA" RNG *is* the CPU generator, so its fork always changes the CPU state."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "CPU RNG state changed within GPU RNG context" not in record.getMessage()


# ------------------------------------------------------------------ optimizer state on the host
# megatron's HybridDeviceOptimizer (optimizer_cpu_offload) splits parameters into device ones (kept and
# stepped where they are) and host copies (`.cpu().pin_memory()` clones stepped by a CPU AdamW) by
# `param.is_cuda`; on a CPU-only torch nothing is a device tensor, so nothing would be offloaded and its
# grad copy would fail. While it sorts parameters (and moves loaded state) this shim lets a CPU tensor
# count as a device tensor unless `.cpu()` made it a host copy (the mark follows detach/clone/float),
# makes `pin_memory()` a no-op and `.to("cuda")` the CPU: its host copies are then real copies, its
# CPU AdamW steps them and its hook copies the result back, exactly the path it takes on an accelerator.
_HOST_COPY = "_asp_host_copy"
_EMULATED = ("is_cuda", "cpu", "pin_memory", "detach", "clone", "float", "to")


def _marked(src: torch.Tensor, out: Any) -> Any:
    if getattr(src, _HOST_COPY, False) and isinstance(out, torch.Tensor):
        setattr(out, _HOST_COPY, True)
    return out


@contextlib.contextmanager
def _emulated_device() -> Iterator[None]:
    """CPU tensors are device tensors for the duration, except the host copies `.cpu()` returns."""
    T = torch.Tensor
    saved = {n: T.__dict__.get(n) for n in _EMULATED}
    orig = {n: getattr(T, n) for n in _EMULATED if n != "is_cuda"}
    real_is_cuda = torch._C.TensorBase.is_cuda.__get__

    def host_copy(t: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        out = orig["cpu"](t, *a, **k)
        setattr(out, _HOST_COPY, True)
        return out

    def to(t: torch.Tensor, *a: Any, **k: Any) -> Any:
        a = tuple("cpu" if _is_cuda(x) else x for x in a)
        return orig["to"](t, *a, **{**k, **({"device": "cpu"} if _is_cuda(k.get("device")) else {})})

    T.is_cuda = property(lambda t: real_is_cuda(t) or (t.device.type == "cpu"
                                                      and not getattr(t, _HOST_COPY, False)))
    T.cpu = host_copy
    T.pin_memory = lambda t, *a, **k: t
    T.to = to
    for name in ("detach", "clone", "float"):
        setattr(T, name, lambda t, *a, _f=orig[name], **k: _marked(t, _f(t, *a, **k)))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                delattr(T, name)
            else:
                setattr(T, name, value)


def _install_hybrid_optimizer_shim() -> None:
    """Run HybridDeviceOptimizer's device sorting under `_emulated_device`; let it take the distributed
    optimizer's fp32 shards (views of the weights, so not leaves: torch refuses to optimize those
    unless they retain their grad, which they never receive from autograd)."""
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer as HDO

    def emulated(method: Any) -> Any:
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _emulated_device():
                return method(self, *args, **kwargs)

        return run

    init = HDO.__init__

    def hdo_init(self: Any, params: Any, *args: Any, **kwargs: Any) -> None:
        groups = params if isinstance(params, list) else list(params)
        for group in groups:
            for p in group["params"] if isinstance(group, dict) else [group]:
                if isinstance(p, torch.Tensor) and not p.is_leaf and p.requires_grad:
                    p.retain_grad()
        init(self, groups, *args, **kwargs)

    def update_fp32_params(self: Any) -> None:
        """megatron re-syncs loaded state into the fp32 copies of low-precision weights and looks one up
        for every parameter; fp32 weights (the CPU trainer's) have none and are their own master."""
        if self.param_update_in_fp32:
            for param, state in self.state.items():
                if param in self.param_to_fp32_param:
                    self.param_to_fp32_param[param].data.copy_(state["master_param"])

    HDO.__init__ = hdo_init
    HDO._update_fp32_params_by_new_state = update_fp32_params
    HDO._get_sub_optimizer_param_groups = emulated(HDO._get_sub_optimizer_param_groups)
    HDO._move_new_state_to_right_device = emulated(HDO._move_new_state_to_right_device)


def prepare(kind: str) -> None:
    """The trainer's side of `asp_npu.device.prepare_megatron`: on CPU, install the shim; else nothing."""
    if kind == "cpu":
        install()


# Transformer Engine helpers megatron's MoE code refers to by name; without TE they are never
# imported, so the first MoE forward raises NameError instead of taking its non-fused path.
_MOE_TE_NAMES = ("te_general_gemm", "fused_compute_score_for_moe_aux_loss", "fused_moe_aux_loss",
                 "fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
                 "fused_sort_chunks_by_index_with_probs", "fused_topk_with_score_function", "fused_unpermute")


def _define_missing_te_names() -> None:
    from megatron.core.transformer.moe import moe_utils

    for name in _MOE_TE_NAMES:
        if not hasattr(moe_utils, name):
            setattr(moe_utils, name, None)


def install() -> None:
    """Patch torch.cuda and megatron's RNG helpers for CPU; idempotent. Call before building models."""
    global _INSTALLED
    if _INSTALLED:
        return
    cuda = torch.cuda
    cuda.current_device = lambda: "cpu"
    cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    cuda.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)
    # torch.manual_seed itself calls torch.cuda.manual_seed_all, so seed the CPU generator directly
    cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    cuda.random.get_rng_state = cuda.get_rng_state
    cuda.random.set_rng_state = cuda.set_rng_state
    cuda.synchronize = lambda device=None: None
    cuda.empty_cache = lambda: None
    cuda.current_stream = lambda device=None: _InertStream()
    cuda.default_stream = lambda device=None: _InertStream()
    cuda.stream = lambda stream=None: contextlib.nullcontext()
    cuda.Stream = _InertStream
    cuda.Event = _InertEvent
    cuda.device = lambda device=None: contextlib.nullcontext()
    cuda.set_device = lambda device: None

    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = _cpu_rng_get
    mrandom._set_cuda_rng_state = _cpu_rng_set
    logging.getLogger(mrandom.__name__).addFilter(_DropForkWarning())
    _define_missing_te_names()
    torch.Tensor.type = _megatron_tensor_type
    for name in _FACTORIES:
        setattr(torch, name, _cpu_factory(getattr(torch, name)))
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    _install_hybrid_optimizer_shim()
    _INSTALLED = True
