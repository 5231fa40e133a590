"""Packed micro-batches (`actor_config.use_remove_padding`): every response token once, boundaries and
restarting positions in the stream, the unpacked log-probs in the padded layout, refusals in one line,
the MindSpeed-RL key imported; slow: log-probs and gradients equal to the padded path over real
megatron process groups (TP=1 with DP=2 and a token budget, TP=2 with sequence parallelism, PP=2)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.cli import main as cli_main
from asp_npu.config import Config, validate
from asp_npu.device import spec
from asp_npu.errors import ConfigError
from asp_npu.trainer.batching import batch_to_samples, make_micro_batches
from asp_npu.trainer.features import block_spec, check_features
from asp_npu.trainer.packing import block_causal_mask, pack, packed_micro_batches, token_groups, unpack
from tests.trainer.test_batching import _batch
from tests.trainer.test_layout import DIMS

LENGTHS = st.lists(st.tuples(st.integers(1, 9), st.integers(1, 40)), min_size=1, max_size=24)


@settings(max_examples=60, deadline=None)
@given(LENGTHS, st.integers(1, 6), st.sampled_from([0, 16, 64]), st.sampled_from([1, 2, 4]))
def test_packed_streams_hold_every_token_once_with_restarting_positions(lengths, mbs, budget, multiple):
    samples, _ = batch_to_samples(_batch(lengths, 1), drop_equal_groups=False)
    micro = packed_micro_batches(samples, mbs, budget, multiple)
    assert sorted(i for mb in micro for i in mb["index"].tolist()) == list(range(len(lengths)))
    by_index = {s.index: s for s in samples}
    for mb in micro:
        cu = mb["cu_seqlens"].tolist()
        real = int(mb["lengths"].sum())
        assert mb["input_ids"].shape == (1, cu[-1]) and cu[-1] % multiple == 0 and cu[-1] - real < multiple
        assert cu[:len(mb["lengths"]) + 1] == [0, *torch.cumsum(mb["lengths"], 0).tolist()]
        assert budget == 0 or real <= budget or len(mb["lengths"]) == 1
        assert budget or len(mb["lengths"]) <= mbs
        for j, idx in enumerate(mb["index"].tolist()):  # each sequence: its tokens, positions from 0
            s, lo = by_index[idx], cu[j]
            assert mb["input_ids"][0, lo:lo + s.length].tolist() == s.tokens[:-1]
            assert mb["labels"][0, lo:lo + s.length].tolist() == s.tokens[1:]
            assert mb["position_ids"][0, lo:lo + s.length].tolist() == list(range(s.length))
    assert sum(int(mb["mask"].sum()) for mb in micro) == sum(r for _, r in lengths)


@settings(max_examples=40, deadline=None)
@given(LENGTHS, st.integers(1, 5), st.sampled_from([1, 2, 3]))
def test_unpack_puts_stream_values_where_the_padded_layout_has_them(lengths, mbs, multiple):
    samples, _ = batch_to_samples(_batch(lengths, 1), drop_equal_groups=False)
    for padded in make_micro_batches(samples, mbs):
        packed = pack(padded, multiple)
        stream = packed["labels"].float().requires_grad_()
        back = unpack(stream, packed)  # the labels travel through pack -> unpack unchanged
        valid = torch.arange(padded["labels"].shape[1]) < padded["lengths"].unsqueeze(1)
        assert torch.equal(back, padded["labels"].float() * valid)
        back.sum().backward()  # differentiable: every real token receives its gradient once
        assert stream.grad is not None and int(stream.grad.sum()) == int(padded["lengths"].sum())
    assert unpack(torch.ones(2, 3), {"mask": torch.zeros(2, 3)}).shape == (2, 3)  # padded: unchanged


def test_token_budget_bins_first_fit_decreasing():
    sizes = [SimpleNamespace(length=n) for n in (50, 10, 30, 20, 40, 60)]
    assert token_groups(sizes, 60) == [[5], [0, 1], [4, 3], [2]]
    assert token_groups(sizes, 10) == [[5], [0], [4], [2], [3], [1]]  # longer than the budget: alone


def test_block_causal_mask_stops_attention_at_sequence_boundaries():
    mask = block_causal_mask(torch.tensor([0, 2, 5], dtype=torch.int32))[0, 0]
    allowed = (~mask).int().tolist()
    assert allowed == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]]


def _problems(**fields: object) -> list[str]:
    cfg = Config()
    cfg.model.build_if_missing = True
    for k, v in fields.items():
        setattr(cfg.actor_config, k, v)
    return [p for p in validate(cfg) if p.startswith("actor_config.use_remove_padding")]


def test_packing_is_refused_in_one_line_where_boundaries_cannot_be_honoured():
    assert _problems(use_remove_padding=True) == []
    cp = _problems(use_remove_padding=True, context_parallel_size=2, data_parallel_size=1)
    assert len(cp) == 1 and "context_parallel_size=2" in cp[0] and "\n" not in cp[0]
    assert _problems(use_remove_padding=False, context_parallel_size=2) == []
    moe = dataclasses.replace(DIMS, num_experts=4)
    act = Config().actor_config
    act.use_remove_padding = True
    with pytest.raises(ConfigError, match="use_remove_padding: not supported for a MoE model"):
        check_features(moe, act)


def test_cli_exits_2_on_packing_with_context_parallelism(capsys: pytest.CaptureFixture[str]) -> None:
    config = Path(__file__).resolve().parents[2] / "configs" / "cpu_tiny.yaml"
    rc = cli_main(["check", "--config", str(config), "--no-sim", "actor_config.use_remove_padding=true",
                   "actor_config.context_parallel_size=2"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "problem: actor_config.use_remove_padding: packed sequences with context_parallel_size=2" in err


def test_block_spec_swaps_in_packed_attention_only_where_the_device_needs_it():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from asp_npu.trainer.packing import PackedAttention

    layer = get_gpt_layer_local_spec(normalization="RMSNorm")
    one = SimpleNamespace(context_parallel_size=1, sequence_parallel=False)
    swapped = block_spec(layer, one, packed_split_attention=spec("cpu").packed_split_attention)
    assert swapped.submodules.self_attention.submodules.core_attention is PackedAttention
    assert block_spec(layer, one, packed_split_attention=spec("npu").packed_split_attention) is layer


def test_mindspeed_use_remove_padding_is_imported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from omegaconf import OmegaConf

    from asp_npu.config import load_config
    from tests.deploy.test_import_config import FIXTURE

    ms = OmegaConf.to_container(OmegaConf.load(FIXTURE))
    ms["rl_config"]["use_remove_padding"] = True
    src = tmp_path / FIXTURE.name
    import shutil

    shutil.copytree(FIXTURE.parent / "model", tmp_path / "model")
    src.write_text(OmegaConf.to_yaml(OmegaConf.create(ms)))
    out = tmp_path / "o.yaml"
    assert cli_main(["import-config", "mindspeed-rl", str(src), "--out", str(out)]) == 0
    assert "not mapped: rl_config.use_remove_padding" not in capsys.readouterr().out
    assert load_config(str(out), check=False).actor_config.use_remove_padding is True


@pytest.mark.slow
def test_packed_training_matches_the_padded_path_at_tp1_tp2_pp2(tmp_path: Path) -> None:
    from tests.trainer import jobs
    from tests.trainer.helpers import PACKED_PAIRS, PACKED_SETUPS, make_hf_model, parity_figures, run_ranks

    model = str(make_hf_model(tmp_path / "hf", tied=True))
    ranks = run_ranks(2, jobs.training_parity, model, PACKED_SETUPS, 2, timeout=900)
    for rank in ranks:  # PP=2: each rank compares its own stage's gradients
        for name, ref in PACKED_PAIRS:
            fig = parity_figures(rank[name], rank[ref])
            assert max(fig.values()) < 1e-5, (name, fig)
            assert rank[name]["core_attention"] == "PackedAttention" and rank[ref]["core_attention"] != \
                "PackedAttention"
