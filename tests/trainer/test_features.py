"""Sequence/context parallel, recomputation and offload settings: refused up front when they cannot
run, mapped one to one onto megatron's TransformerConfig otherwise; sequence-parallel padding, the
context-parallel chunks and core attention."""

from __future__ import annotations

import pytest

from asp_npu.config import Config, validate
from asp_npu.errors import ConfigError
from asp_npu.trainer.batching import Sample, make_micro_batches
from asp_npu.trainer.features import check_features, megatron_features
from tests.trainer.test_layout import DIMS


def problems(**fields: object) -> list[str]:
    cfg = Config()
    cfg.model.build_if_missing = True
    for k, v in fields.items():
        target = cfg.rl_config if k == "mode" else cfg.actor_config
        setattr(target, k, v)
    return validate(cfg)


def test_defaults_are_valid_and_turn_nothing_on():
    assert problems() == []
    assert megatron_features(Config().actor_config) == {"sequence_parallel": False}


@pytest.mark.parametrize(("fields", "needle"), [
    ({"sequence_parallel": True}, "sequence_parallel: needs tensor_model_parallel_size > 1"),
    ({"recompute_granularity": "partial"}, "recompute_granularity: 'partial' is not"),
    ({"recompute_granularity": "full", "recompute_method": "every"}, "recompute_method: 'every'"),
    ({"recompute_granularity": "selective", "recompute_method": "block"}, "only applies with"),
    ({"recompute_granularity": "full", "recompute_num_layers": 0}, "recompute_num_layers: must be >= 1"),
    ({"offload_train_grad": True}, "offload_train_grad: offload only applies when rollout and"),
    ({"offload_train_param": True, "mode": "one-step-off"}, "not in mode 'one-step-off'"),
])
def test_settings_that_cannot_run_are_named(fields, needle):
    found = problems(**fields)
    assert len(found) == 1 and needle in found[0], found


def test_valid_combinations_pass():
    assert problems(sequence_parallel=True, tensor_model_parallel_size=2) == []
    assert problems(recompute_granularity="full", recompute_method="block", recompute_num_layers=2) == []
    assert problems(mode="mindspeed-sync", offload_train_optimizer=True, offload_train_grad=True,
                    offload_train_param=True) == []


def test_recompute_layers_beyond_a_pipeline_stage_are_refused_before_any_process_group():
    act = Config().actor_config
    act.recompute_granularity, act.recompute_num_layers = "full", 3
    with pytest.raises(ConfigError, match="recompute_num_layers=3: must be between 1 and the 2 layers"):
        check_features(DIMS, act)
    act.recompute_num_layers, act.pipeline_model_parallel_size = 2, 2
    with pytest.raises(ConfigError, match="the 1 layers per pipeline stage"):
        check_features(DIMS, act)


def test_megatron_features_map_the_mindspeed_keys():
    act = Config().actor_config
    act.sequence_parallel, act.recompute_granularity, act.recompute_num_layers = True, "full", 2
    assert megatron_features(act) == {"sequence_parallel": True, "recompute_granularity": "full",
                                      "recompute_method": "uniform", "recompute_num_layers": 2}
    act.recompute_granularity = "selective"
    assert megatron_features(act) == {"sequence_parallel": True, "recompute_granularity": "selective"}


def test_sequence_parallel_pads_micro_batches_to_a_multiple_of_tp():
    samples = [Sample(i, list(range(1, n + 2)), 2, 0.5, [0.0] * (n - 1)) for i, n in enumerate([7, 4, 9])]
    for mb in make_micro_batches(samples, micro_batch_size=2, pad_multiple=4):
        assert mb["input_ids"].shape[1] % 4 == 0
        for j, n in enumerate(mb["lengths"].tolist()):  # padding carries no loss
            assert mb["mask"][j, n:].sum() == 0
    plain = make_micro_batches(samples, micro_batch_size=2)
    assert [mb["input_ids"].shape[1] for mb in plain] == [9, 4]


def test_context_parallel_chunks_cover_each_sequence_once_and_balance_causal_work():
    from asp_npu.trainer.context_parallel import chunk_positions, gathered_positions

    for cp in (2, 3, 4):
        local = 2 * 5
        held = [chunk_positions(r, cp, local).tolist() for r in range(cp)]
        assert sorted(p for h in held for p in h) == list(range(cp * local))
        assert gathered_positions(cp, local).tolist() == [p for h in held for p in h]
        work = [sum(p + 1 for p in h) for h in held]  # keys each rank's queries attend to (causal)
        assert len(set(work)) == 1


def test_context_parallel_swaps_the_core_attention_unless_the_device_stack_does_cp():
    from types import SimpleNamespace

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from asp_npu.device import spec
    from asp_npu.trainer.context_parallel import ContextParallelAttention
    from asp_npu.trainer.features import block_spec

    layer = get_gpt_layer_local_spec(normalization="RMSNorm")
    cp2 = SimpleNamespace(context_parallel_size=2, sequence_parallel=False)
    core = block_spec(layer, cp2).submodules.self_attention.submodules.core_attention
    assert core is ContextParallelAttention
    native = block_spec(layer, cp2, spec("npu").cp_gather_attention)
    assert native.submodules.self_attention.submodules.core_attention is DotProductAttention  # MindSpeed's
    one = SimpleNamespace(context_parallel_size=1, sequence_parallel=False)
    assert block_spec(layer, one) is layer and spec("cpu").cp_gather_attention
