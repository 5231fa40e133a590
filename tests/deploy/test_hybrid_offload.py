"""`check`'s sizing of megatron-core's HybridDeviceOptimizer (`asp_npu.deploy.hybrid`): the same
whole-tensor threshold rule as megatron's own code, the order the distributed optimizer hands the
tensors over, and the bytes measured on the tiny CPU model (docs/BENCHMARKS.md). Pure: no trainer."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from asp_npu.arch import ModelDims
from asp_npu.deploy.hybrid import ParamTensor, dp_shards, hybrid_split, rank_splits, stage_tensors

TINY = ModelDims(hidden_size=64, num_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=203,
                 intermediate_size=96, tie_word_embeddings=True)  # tests/trainer/helpers.make_hf_model


class _Host:
    """What `param.detach().clone().cpu().pin_memory()` gives megatron: a host tensor."""

    is_cuda = False

    def __init__(self, n: int) -> None:
        self.n = n

    def numel(self) -> int:
        return self.n

    def clone(self) -> _Host:
        return self

    def cpu(self) -> _Host:
        return self

    def pin_memory(self) -> _Host:
        return self


class _Device(_Host):
    is_cuda = True

    def detach(self) -> _Host:
        return _Host(self.n)


def _megatron_hybrid_module() -> Any:
    """megatron-core's hybrid_optimizer.py loaded on its own (it imports only torch): the installed
    code, without importing the rest of megatron."""
    spec = importlib.util.find_spec("megatron")
    assert spec is not None and spec.submodule_search_locations
    root = Path(list(spec.submodule_search_locations)[0])
    path = root / "core" / "optimizer" / "cpu_offloading" / "hybrid_optimizer.py"
    mod_spec = importlib.util.spec_from_file_location("_megatron_hybrid_optimizer", path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def _megatron_host_numels(groups: list[list[int]], fraction: float) -> list[int]:
    """megatron-core's own `_get_sub_optimizer_param_groups` on stand-in tensors: the host tensors' sizes."""
    hdo_cls = _megatron_hybrid_module().HybridDeviceOptimizer
    hdo: Any = SimpleNamespace(param_groups=[{"params": [_Device(n) for n in g]} for g in groups],
                               param_update_in_fp32=False)
    cpu_groups = hdo_cls._get_sub_optimizer_param_groups(hdo, fraction)[0]
    return [p.numel() for g in cpu_groups for p in g["params"]]


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.25, 0.5, 0.51, 0.9, 1.0])
def test_the_split_is_megatrons_rule_on_a_hand_built_tensor_list(fraction: float) -> None:
    decayed, plain = [4096, 12288, 64, 8192, 100, 30000, 7], [64, 128, 64]  # two groups, as megatron's
    host = _megatron_host_numels([decayed, plain], fraction)
    split = hybrid_split(decayed + plain, fraction)
    assert split.host == sum(host) and split.host_tensors == len(host)
    assert split.device + split.host == sum(decayed + plain)
    assert split.host >= fraction * sum(decayed + plain)  # the crossing tensor goes whole


def test_the_optimizer_gets_the_decayed_tensors_first_in_reverse_registration_order() -> None:
    t = [ParamTensor("a", 10), ParamTensor("norm", 4, decay=False), ParamTensor("b", 20),
         ParamTensor("bias", 6, decay=False)]
    (only,) = dp_shards(t, 1)
    assert [x.name for x, _ in only] == ["b", "a", "bias", "norm"]


def test_each_dp_rank_owns_a_contiguous_padded_share_of_the_buffer() -> None:
    t = [ParamTensor("a", 100), ParamTensor("b", 200)]  # buffer: b at 0, a at 256 (64-aligned), 384 padded
    r0, r1 = dp_shards(t, 2)  # 192 elements each
    assert [(x.name, n) for x, n in r0] == [("b", 192)]
    assert [(x.name, n) for x, n in r1] == [("b", 8), ("a", 100)]


MEASURED = {  # docs/BENCHMARKS.md, "Optimizer state on the host": TrainerWorker.optimizer_bytes() per rank
    (1, 0.0): [(600_128, 0)], (1, 1.0): [(0, 1_200_192)], (1, 0.5): [(206_888, 786_456)],
    (2, 0.0): [(300_072, 0), (300_060, 0)], (2, 1.0): [(0, 600_104), (0, 600_092)],
    (2, 0.5): [(87_068, 425_996), (138_772, 322_568)],
    (1, 0.25): [(387_124, 425_996)], (2, 0.25): [(152_608, 294_920), (204_312, 191_492)],
}


@pytest.mark.parametrize(("dp", "fraction"), list(MEASURED))
def test_the_tiny_models_measured_bytes_are_predicted_exactly(dp: int, fraction: float) -> None:
    dense, experts = stage_tensors(TINY, range(2), 1, 1, 1, True, True, 1)
    assert not experts and sum(x.numel for x in dense) == 75_008
    got = [s.measured_like(master=False) for s in rank_splits(dense, dp, fraction)]
    assert [(g["device"], g["host"]) for g in got] == MEASURED[(dp, fraction)]


def test_a_tied_embedding_across_pipeline_stages_gets_its_own_bucket() -> None:
    first, _ = stage_tensors(TINY, range(1), 1, 1, 1, True, False, 2)
    last, _ = stage_tensors(TINY, range(1, 2), 1, 1, 1, False, True, 2)
    assert first[0].own_bucket and last[-1].name == "output_layer" and last[-1].own_bucket
    r0, r1 = dp_shards(last, 2)  # its bucket (12,992 padded to 13,056) splits in halves of 6,528
    assert dict((x.name, n) for x, n in r0)["output_layer"] == 6_528
    assert dict((x.name, n) for x, n in r1)["output_layer"] == 12_992 - 6_528
