"""The NPU path of asp_npu.device, tested where torch_npu / mindspeed / vllm_ascend are absent:
`importlib.util.find_spec`, the environment and vLLM's plugin registry are replaced by fakes."""

from __future__ import annotations

import importlib.util

import pytest

from asp_npu import device

NPU_MODULES = {"torch_npu", "mindspeed", "vllm_ascend"}


@pytest.fixture
def fake_stack(monkeypatch: pytest.MonkeyPatch):
    """Pretend a set of modules is installed and a set of vLLM platform plugins is registered."""
    real = importlib.util.find_spec

    def install(modules: set[str], plugins: list[str], cann: str | None) -> None:
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a: (
                object() if name in modules else (None if name in NPU_MODULES else real(name, *a))
            ),
        )
        monkeypatch.setattr(device, "vllm_platform_plugins", lambda: plugins)
        for var in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
            monkeypatch.delenv(var, raising=False)
        if cann:
            monkeypatch.setenv("ASCEND_TOOLKIT_HOME", cann)

    return install


def test_complete_stack_has_no_problems(fake_stack) -> None:
    fake_stack(NPU_MODULES, ["ascend"], "/usr/local/Ascend/ascend-toolkit/latest")
    assert device.npu_stack_problems() == []
    assert device.vllm_platform("npu") == "ascend"
    device.require_npu_stack()


def test_empty_stack_names_every_missing_piece(fake_stack) -> None:
    fake_stack(set(), [], None)
    problems = device.npu_stack_problems()
    assert len(problems) == 4
    assert "CANN is not sourced" in problems[0]
    for module in ("torch_npu", "mindspeed", "vllm_ascend"):
        assert any(f"'{module}' is missing" in p for p in problems)
    with pytest.raises(RuntimeError, match="incomplete"):
        device.require_npu_stack()
    with pytest.raises(RuntimeError, match="vllm-ascend"):
        device.vllm_platform("npu")


def test_vllm_ascend_installed_but_not_registered(fake_stack) -> None:
    fake_stack(NPU_MODULES, [], "/opt/cann")
    assert device.npu_stack_problems() == [
        "vllm-ascend is installed but not registered as a vLLM platform plugin (entry point "
        "vllm.platform_plugins 'ascend'): reinstall it into this environment"
    ]


def test_detect_npu_without_torch_npu_is_a_clear_error(fake_stack) -> None:
    fake_stack(set(), [], None)
    with pytest.raises(RuntimeError, match="torch_npu is not installed"):
        device.detect("npu")
    assert device.detect("auto") in ("cpu", "cuda")


def test_backends_and_visible_devices() -> None:
    assert [device.collective_backend(k) for k in ("cpu", "npu", "cuda")] == ["gloo", "hccl", "nccl"]
    assert device.visible_devices("npu", [4, 5, 6, 7]) == {"ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7"}
    assert device.visible_devices("cpu", [0]) == {}
    assert device.vllm_platform("cpu") is None
    env = device.rollout_env("npu", [2], kv_cache_gib=1.0)
    assert (
        env["ASCEND_RT_VISIBLE_DEVICES"] == "2"
        and env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"
    )


def test_prepare_megatron_on_npu_imports_torch_npu_then_the_mindspeed_adaptor(monkeypatch) -> None:
    """Fake torch_npu / mindspeed packages (a meta-path finder records what gets executed, in order)."""
    import importlib.abc
    import importlib.machinery
    import sys

    executed: list[str] = []
    fakes = {"torch_npu", "mindspeed", "mindspeed.megatron_adaptor"}

    class Loader(importlib.abc.Loader):
        def create_module(self, spec):
            return None

        def exec_module(self, module) -> None:
            executed.append(module.__name__)
            module.__path__ = []  # a package, so mindspeed.megatron_adaptor can be imported below it

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            return importlib.machinery.ModuleSpec(name, Loader(), is_package=True) if name in fakes else None

    assert not fakes & set(sys.modules)
    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    try:
        device.prepare_megatron("npu")
    finally:
        for name in fakes:  # no fake may leak into later tests (find_spec would report torch_npu present)
            sys.modules.pop(name, None)
    assert executed == ["torch_npu", "mindspeed", "mindspeed.megatron_adaptor"]
    assert not any(m == "megatron" or m.startswith("megatron.") for m in executed)


def test_cpu_placement_is_disjoint_when_rollout_and_trainer_fit() -> None:
    p = device.cpu_placement([0, 1], num_instances=1, cores_per_instance=1, trainer_world=1, colocated=False)
    assert p.disjoint and p.instance_cores == ((0,),) and p.trainer_cores == (1,) and p.rollout_nice == 0
    p = device.cpu_placement(list(range(8)), 2, 2, 2, colocated=False)
    assert p.instance_cores == ((0, 1), (2, 3)) and p.trainer_cores == (4, 5, 6, 7)
    assert [device.rank_cores(p.trainer_cores, r, 2) for r in range(2)] == [[4, 5], [6, 7]]


def test_cpu_placement_shares_cores_when_they_do_not_fit_or_the_mode_is_colocated() -> None:
    p = device.cpu_placement([0, 1], num_instances=2, cores_per_instance=1, trainer_world=1, colocated=False)
    assert not p.disjoint and p.instance_cores == ((0,), (1,)) and p.trainer_cores == (0, 1)
    assert p.rollout_nice > 0  # the trainer, the asynchronous critical path, is not starved
    p = device.cpu_placement([0, 1], num_instances=2, cores_per_instance=1, trainer_world=1, colocated=True)
    assert not p.disjoint and p.rollout_nice == 0  # alternating: nothing overlaps
    assert device.rank_cores((0,), 1, 2) == [0]  # more ranks than cores: they share
    assert device.node_placement("npu", 16, 4, 2, 8, colocated=False) is None  # Ray hands out the cards
