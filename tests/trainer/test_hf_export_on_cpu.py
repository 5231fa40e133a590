"""The HF writer (export-hf and SFT) and the export of a dist checkpoint, in one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from asp_npu.arch import ModelDims
from asp_npu.core.layout import ParallelLayout
from asp_npu.errors import UserError
from asp_npu.io import MODEL_MARKER
from asp_npu.trainer.convert import hf_to_megatron, read_hf_state
from asp_npu.trainer.hf_export import MARKER, check_out_dir, export_checkpoint, write_hf_folder
from tests.trainer.helpers import make_hf_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_hf_model(tmp_path_factory.mktemp("src") / "m", tied=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sharded_folder_in_the_models_dtype_loads_in_transformers(model_dir: Path, tmp_path: Path,
                                                                  dtype: torch.dtype) -> None:
    from transformers import AutoModelForCausalLM

    hf = read_hf_state(model_dir)
    out = write_hf_folder(hf, model_dir, tmp_path / "out", dtype, {"step": 3}, max_shard_bytes=64 << 10)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and sorted(index["weight_map"]) == sorted(hf)
    assert json.loads((out / "config.json").read_text())["dtype"] == str(dtype).removeprefix("torch.")
    assert json.loads((out / MARKER).read_text())["step"] == 3
    assert (out / "generation_config.json").is_file()
    back = read_hf_state(out)
    assert all(back[k].dtype == dtype and torch.equal(back[k], hf[k].to(dtype)) for k in hf)
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert next(model.parameters()).dtype == dtype
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


def test_out_dir_guard(tmp_path: Path) -> None:
    assert check_out_dir(tmp_path / "new") == tmp_path / "new"
    (tmp_path / "empty").mkdir()
    check_out_dir(tmp_path / "empty")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "a.txt").write_text("x")
    with pytest.raises(UserError, match="theirs.*a.txt"):
        check_out_dir(tmp_path / "theirs")
    (tmp_path / "theirs" / MODEL_MARKER).write_text("")  # a model folder asp-npu wrote
    check_out_dir(tmp_path / "theirs")


def _fake_checkpoint(root: Path, model_dir: Path, hf: dict[str, torch.Tensor], dims: ModelDims) -> Path:
    """A trainer checkpoint's files as `checkpoint.save_checkpoint` lays them out, its dist part saved by
    megatron-core's `dist_checkpointing.save` of global tensors (per-layer keys, TE norm names)."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor

    from asp_npu.trainer import cpu_compat
    from asp_npu.trainer.checkpoint import SCHEMA

    cpu_compat.prepare("cpu")  # megatron's writer calls torch.cuda.synchronize

    full = hf_to_megatron(hf, dims, ParallelLayout(1, 1, 1), 0, 0)
    full = {k.replace("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"): v
            for k, v in full.items()}
    it = root / "iter_0000004"
    (it / "dist").mkdir(parents=True)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        dist_checkpointing.save({k: ShardedTensor.from_rank_offsets(k, v) for k, v in full.items()},
                                str(it / "dist"))
    finally:
        dist.destroy_process_group()
    meta = {"schema": SCHEMA, "iteration": it.name, "step": 4, "policy_version": 2,
            "layout": {"tp": 1, "pp": 1, "dp": 1, "cp": 1}, "model_path": str(model_dir),
            "use_distributed_optimizer": False}
    (it / "trainer.json").write_text(json.dumps(meta))
    (root / "latest.json").write_text(json.dumps(meta))
    return root


def test_export_of_a_dist_checkpoint_gives_back_the_weights(model_dir: Path, tmp_path: Path) -> None:
    hf = read_hf_state(model_dir)
    dims = ModelDims.from_hf_dir(model_dir)
    ckpt = _fake_checkpoint(tmp_path / "ckpt", model_dir, hf, dims)
    result = export_checkpoint(ckpt, tmp_path / "hf", max_shard_bytes=1 << 20)
    assert result["step"] == 4 and result["policy_version"] == 2 and result["dtype"] == "float32"
    back = read_hf_state(tmp_path / "hf")
    assert sorted(back) == sorted(hf) and all(torch.equal(back[k], hf[k]) for k in hf)
    (ckpt / "latest.json").write_text('{"iteration": ')  # torn pointer: refused, nothing written
    with pytest.raises(UserError, match="torn or unreadable checkpoint pointer"):
        export_checkpoint(ckpt, tmp_path / "hf2")
    assert not (tmp_path / "hf2").exists()
