"""Megatron checkpoints in (legacy mp_rank_* layout, dist checkpoints) and HF folders out: pure file and
tensor logic, no process group (the multi-rank runs are in test_checkpoint_io.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asp_npu.core.layout import ParallelLayout
from asp_npu.data.megatron_folder import LEGACY_FILE, OURS, TRACKER, is_megatron, locate
from asp_npu.errors import UserError
from asp_npu.trainer.convert import hf_to_megatron
from asp_npu.trainer.megatron_ckpt import merge_tp, read_megatron, unstack
from tests.trainer.test_convert import DIMS, _hf_state

TIED = DIMS.__class__(**{**DIMS.__dict__, "tie_word_embeddings": True})


def write_legacy(root: Path, hf: dict[str, torch.Tensor], tp: int, pp: int, stages: tuple[int, ...] = (),
                 te_names: bool = False, tied: bool = False, iteration: int = 20) -> Path:
    """A Megatron-LM legacy-layout folder: one torch.save'd {'model', 'args', ...} per (tp, pp) rank."""
    dims = TIED if tied else DIMS
    lay = ParallelLayout(tp, pp, 1, stages=stages)
    it = root / f"iter_{iteration:07d}"
    for p in range(pp):
        for t in range(tp):
            sd = hf_to_megatron(hf, dims, lay, t, p)
            if te_names:
                sd = {k.replace("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight")
                      .replace("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight"): v
                      for k, v in sd.items()}
            sd["decoder.layers.0.mlp.linear_fc1._extra_state"] = None  # TE-style extra state is skipped
            name = f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "")
            (it / name).mkdir(parents=True)
            args = argparse.Namespace(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                      expert_model_parallel_size=1, num_layers=dims.num_layers)
            torch.save({"model": sd, "args": args, "iteration": iteration, "checkpoint_version": 3.0},
                       it / name / LEGACY_FILE)
    (root / TRACKER).write_text(str(iteration))
    return root


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2, 4]), tied=st.booleans(), te=st.booleans(),
       uneven=st.booleans())
def test_legacy_layout_at_any_tp_pp_merges_to_the_source_weights(tmp_path_factory, tp, pp, tied, te, uneven):
    hf = _hf_state(DIMS)
    if tied:
        hf.pop("lm_head.weight")
    stages = (1, 3) if uneven and pp == 2 else ()
    root = write_legacy(tmp_path_factory.mktemp("m"), hf, tp, pp, stages, te, tied)
    _same(read_megatron(root, TIED if tied else DIMS), hf)


def test_virtual_pipeline_chunks_are_stacked_chunk_major(tmp_path: Path) -> None:
    """Megatron's interleaved schedule: stage p's chunk c holds layers (c * PP + p) * per-chunk ..."""
    hf = _hf_state(DIMS)
    one = ParallelLayout(1, 4, 1)  # 4 one-layer pieces: chunk c of stage p = piece c * 2 + p
    it = tmp_path / "iter_0000001"
    for p in range(2):
        state = {"args": argparse.Namespace(tensor_model_parallel_size=1, pipeline_model_parallel_size=2)}
        for c in range(2):
            piece = hf_to_megatron(hf, DIMS, one, 0, c * 2 + p)
            state[f"model{c}"] = piece
        (it / f"mp_rank_00_{p:03d}").mkdir(parents=True)
        torch.save(state, it / f"mp_rank_00_{p:03d}" / LEGACY_FILE)
    _same(read_megatron(it, DIMS), hf)


def test_fc1_merge_is_gates_then_ups_and_rows_or_columns_by_parallelism() -> None:
    g0, u0, g1, u1 = (torch.full((2, 3), float(i)) for i in range(4))
    assert merge_tp("decoder.layers.0.mlp.linear_fc1.weight", [torch.cat([g0, u0]), torch.cat([g1, u1])]) \
        .tolist() == torch.cat([g0, g1, u0, u1]).tolist()
    a, b = torch.zeros(2, 3), torch.ones(2, 3)
    assert merge_tp("decoder.layers.0.self_attention.linear_proj.weight", [a, b]).shape == (2, 6)
    assert merge_tp("decoder.layers.0.self_attention.linear_qkv.weight", [a, b]).shape == (4, 3)
    assert torch.equal(merge_tp("decoder.layers.0.input_layernorm.weight", [a, b]), a)
    with pytest.raises(UserError, match="not a megatron-core GPT parameter"):
        merge_tp("language_model.encoder.layers.0.self_attention.query_key_value.weight", [a, b])


def test_dist_names_unstack_layers_and_experts() -> None:
    sd = {"decoder.layers.self_attention.linear_qkv.layer_norm_weight": torch.arange(6.).reshape(2, 3),
          "decoder.layers.mlp.experts.linear_fc1.weight": torch.arange(24.).reshape(2, 3, 4),
          "decoder.final_layernorm.weight": torch.ones(3)}
    out = unstack(sd)
    assert torch.equal(out["decoder.layers.1.input_layernorm.weight"], torch.tensor([3., 4., 5.]))
    assert torch.equal(out["decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight"],
                       torch.arange(20., 24.))
    assert "decoder.final_layernorm.weight" in out and len(out) == 2 + 6 + 1


# ------------------------------------------------------------------ bad input: one line, nothing read
def test_missing_rank_is_named(tmp_path: Path) -> None:
    root = write_legacy(tmp_path, _hf_state(DIMS), 2, 2)
    (root / "iter_0000020" / "mp_rank_01_001" / LEGACY_FILE).unlink()
    with pytest.raises(UserError, match=r"missing 1 of 4 model-parallel ranks \(TP=2 x PP=2\): mp_rank_01_0"):
        locate(root)


def test_a_missing_last_tp_column_is_caught_by_the_recorded_args(tmp_path: Path) -> None:
    root = write_legacy(tmp_path, _hf_state(DIMS), 2, 1)
    import shutil

    shutil.rmtree(root / "iter_0000020" / "mp_rank_01")
    with pytest.raises(UserError, match="its args say TP=2 x PP=1 x EP=1: ranks are missing"):
        read_megatron(root, DIMS)


def test_tp_that_does_not_divide_the_heads_is_refused_before_reading(tmp_path: Path) -> None:
    it = tmp_path / "iter_0000001"
    for t in range(3):
        (it / f"mp_rank_{t:02d}").mkdir(parents=True)
        (it / f"mp_rank_{t:02d}" / LEGACY_FILE).write_bytes(b"never read")
    with pytest.raises(UserError, match="TP=3, which does not divide the 4 attention heads / 2 query groups"):
        read_megatron(it, DIMS)


@pytest.mark.parametrize("tracker, match", [("12x", "torn or not an iteration number"),
                                            ("7", "names iter_0000007, which is missing")])
def test_torn_tracker(tmp_path: Path, tracker: str, match: str) -> None:
    root = write_legacy(tmp_path, _hf_state(DIMS), 1, 1)
    (root / TRACKER).write_text(tracker)
    with pytest.raises(UserError, match=match):
        locate(root)


def test_another_models_weights_are_refused_in_one_line(tmp_path: Path) -> None:
    root = write_legacy(tmp_path, _hf_state(DIMS), 1, 2)
    other = DIMS.__class__(**{**DIMS.__dict__, "num_layers": 6})
    with pytest.raises(UserError, match="has 4 decoder layers; model.path has 6"):
        read_megatron(root, other)


def test_incomplete_dist_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    with pytest.raises(UserError, match="incomplete dist checkpoint"):
        locate(tmp_path)


# ------------------------------------------------------------------ config keys
def test_ours_and_foreign_are_told_apart(tmp_path: Path) -> None:
    from asp_npu.trainer.checkpoint import POINTER, TRAINER_META

    assert OURS == (POINTER, TRAINER_META)
    meg = write_legacy(tmp_path / "meg", _hf_state(DIMS), 1, 1)
    ours = tmp_path / "ours"
    (ours / "iter_0000002").mkdir(parents=True)
    (ours / "latest.json").write_text("{}")
    assert is_megatron(meg) and is_megatron(meg / "iter_0000020")
    assert not is_megatron(ours) and not is_megatron(tmp_path / "absent")


def test_actor_config_load_naming_megatron_weights_is_the_initial_policy(tmp_path: Path) -> None:
    from asp_npu.config import load_config

    meg = write_legacy(tmp_path / "meg", _hf_state(DIMS), 1, 1)
    cfg = load_config(None, [f"actor_config.load={meg}"])
    assert cfg.model.load_megatron == str(meg) and cfg.actor_config.load == ""
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "latest.json").write_text("{}")
    cfg = load_config(None, [f"actor_config.load={ours}"])
    assert cfg.actor_config.load == str(ours) and cfg.model.load_megatron == ""


def test_validate_lists_a_broken_megatron_folder(tmp_path: Path) -> None:
    from asp_npu.config import load_config
    from asp_npu.errors import ConfigError

    root = write_legacy(tmp_path / "meg", _hf_state(DIMS), 2, 1)
    (root / "iter_0000020" / "mp_rank_01" / LEGACY_FILE).unlink()
    with pytest.raises(ConfigError, match="missing 1 of 2 model-parallel ranks"):
        load_config(None, [f"model.load_megatron={root}"])
    with pytest.raises(ConfigError, match="is not a folder"):
        load_config(None, [f"model.load_megatron={tmp_path / 'nope'}", "model.build_if_missing=false",
                           f"model.path={tmp_path}"])


def test_mindspeed_rl_load_imports_as_the_initial_policy(tmp_path: Path) -> None:
    """MindSpeed-RL's actor_config.load (./ckpt in its GRPO configs: a MindSpeed-LLM conversion)."""
    from omegaconf import OmegaConf

    from asp_npu.cli import main as cli_main

    fixture = Path(__file__).parents[1] / "deploy" / "fixtures" / "grpo_qwen25_7b_A3.yaml"
    out = tmp_path / "asp.yaml"
    assert cli_main(["import-config", "mindspeed-rl", str(fixture), "--out", str(out)]) == 0
    cfg = OmegaConf.load(out)
    assert cfg.model.load_megatron == "./ckpt" and not cfg.actor_config.get("load")
