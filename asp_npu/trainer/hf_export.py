"""Hugging Face folders out of the trainer: `asp-npu export-hf` (an RL checkpoint) and the SFT output.

One writer, `write_hf_folder`: sharded safetensors in the model's dtype
(`model-0000i-of-0000n.safetensors` + `model.safetensors.index.json`, the layout `save_pretrained`
writes), `config.json` with that dtype, the tokenizer files and `generation_config.json` of the
model folder the run started from, and `asp_npu_export.json` (what was exported: it marks the folder
as ours, so a later export may replace it). The folder is written under a temp name, fsync'd and
renamed (`asp_npu.io.atomic_replace_dir`): readers see no folder, the old one, or the whole new one.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asp_npu.errors import UserError
from asp_npu.weights.hf import HFWeights

MARKER = "asp_npu_export.json"
INDEX = "model.safetensors.index.json"
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")
_SKIP = (INDEX, "pytorch_model.bin.index.json", MARKER, "config.json")


def check_out_dir(out: str | Path) -> Path:
    """Refuse an existing non-empty folder that asp-npu did not write (its files would be replaced):
    the one output rule (`asp_npu.outputs`), which knows our model folders by their marker."""
    from asp_npu.outputs import check_output_folder

    p = Path(out)
    if p.exists() and not p.is_dir():
        raise UserError(f"--out: {p} exists and is not a folder")
    return check_output_folder(out, flag="--out", parents=True)


def write_hf_folder(tensors: Mapping[str, torch.Tensor | np.ndarray], src_dir: str | Path,
                    out_dir: str | Path, dtype: torch.dtype, info: Mapping[str, Any] | None = None,
                    max_shard_bytes: int = 2 << 30) -> Path:
    """Write `tensors` (full HF names) as an HF folder next to `src_dir`'s config and tokenizer."""
    from asp_npu.io import atomic_replace_dir

    src = Path(src_dir)
    if not (src / "config.json").is_file():
        raise UserError(f"{src}: no config.json (the model folder the weights belong to)")
    state = {k: (torch.from_numpy(np.asarray(v)) if isinstance(v, np.ndarray) else v)
             .to(dtype, copy=True).contiguous() for k, v in tensors.items()}  # safetensors: no shared memory
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)

    def fill(tmp: Path) -> None:
        _write_shards(state, tmp, max_shard_bytes)
        _write_config(src, tmp, dtype)
        for f in src.iterdir():
            if f.is_file() and not f.name.endswith(_WEIGHTS) and f.name not in _SKIP:
                shutil.copy2(f, tmp / f.name)
        if not (tmp / "generation_config.json").is_file():
            _write_generation_config(tmp)
        (tmp / MARKER).write_text(json.dumps({"schema": "asp-npu-hf-export/1", "dtype": _name(dtype),
                                              "tensors": len(state), **(info or {})}, indent=2) + "\n")

    return atomic_replace_dir(out, fill)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _write_shards(state: Mapping[str, torch.Tensor], tmp: Path, max_shard_bytes: int) -> None:
    """safetensors shards as `save_pretrained` names them, split by huggingface_hub's own planner."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    split = split_torch_state_dict_into_shards(dict(state), max_shard_size=max_shard_bytes,
                                               filename_pattern="model{suffix}.safetensors")
    files = split.filename_to_tensors
    if not split.is_sharded:  # always an index: one file is "model-00001-of-00001.safetensors"
        files = {"model-00001-of-00001.safetensors": next(iter(files.values()))}
    weight_map: dict[str, str] = {}
    for fname, names in files.items():
        save_file({n: state[n] for n in names}, str(tmp / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, fname))
    total = int(sum(t.numel() * t.element_size() for t in state.values()))
    (tmp / INDEX).write_text(json.dumps({"metadata": {"total_size": total},
                                         "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")


def _write_config(src: Path, tmp: Path, dtype: torch.dtype) -> None:
    cfg = json.loads((src / "config.json").read_text())
    keys = [k for k in ("dtype", "torch_dtype") if k in cfg] or ["dtype"]
    for k in keys:
        cfg[k] = _name(dtype)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _write_generation_config(tmp: Path) -> None:
    """The model config's bos/eos/pad ids as generation defaults (what `save_pretrained` writes)."""
    from transformers import AutoConfig, GenerationConfig

    GenerationConfig.from_model_config(AutoConfig.from_pretrained(str(tmp))).save_pretrained(str(tmp))


def megatron_to_hf_folder(load_megatron: str | Path, model_dir: str | Path, out: str | Path) -> Path:
    """A Megatron checkpoint (`model.load_megatron`) as an HF folder beside `model_dir`'s config and
    tokenizer: the run's initial policy, which the rollout instances load as the trainer does."""
    from asp_npu.arch import ModelDims
    from asp_npu.trainer.megatron_ckpt import read_megatron

    hf = read_megatron(load_megatron, ModelDims.from_hf_dir(model_dir))
    info = {"source": str(Path(load_megatron).resolve()), "model_path": str(model_dir)}
    return write_hf_folder(hf, model_dir, out, next(iter(hf.values())).dtype, info)


# ------------------------------------------------------------------ export of a trainer checkpoint
def checkpoint_iteration(root: str | Path, step: int | None) -> dict[str, Any]:
    """The complete iteration to export (`latest.json`'s, `iter_<step>`, or `root` itself) and its
    trainer.json. Any schema exports: only the model tensors of `dist/` are read."""
    from asp_npu.io import read_json_file
    from asp_npu.trainer.checkpoint import POINTER, TRAINER_META, complete_iterations

    r = Path(root)
    if not r.is_dir():
        raise UserError(f"{root}: not a folder (expected RUN_DIR/checkpoints)")
    have = ", ".join(str(int(p.name[5:])) for p in complete_iterations(r))
    hint = f"; complete steps: {have} (--step N)" if have else "; no complete iteration"
    if step is not None:
        it = r / f"iter_{step:07d}"
    elif (r / TRAINER_META).is_file():
        it = r
    elif not (r / POINTER).is_file():
        raise UserError(f"{root}: no {POINTER} (a torn or foreign checkpoint folder){hint}")
    else:
        try:
            it = r / str(read_json_file(r / POINTER, "checkpoint pointer")["iteration"])
        except (UserError, KeyError, TypeError) as exc:
            raise UserError(f"{r / POINTER}: torn or unreadable checkpoint pointer ({exc}){hint}") from None
    if not (it / TRAINER_META).is_file():
        raise UserError(f"{root}: {it.name} is incomplete or missing (no {TRAINER_META}){hint}")
    meta = read_json_file(it / TRAINER_META, "trainer checkpoint metadata")
    if not isinstance(meta, dict):
        raise UserError(f"{it / TRAINER_META}: not a JSON object")
    return {**meta, "path": str(it)}


def export_checkpoint(root: str | Path, out: str | Path, step: int | None = None,
                      model_dir: str | Path | None = None, max_shard_bytes: int = 2 << 30) -> dict[str, Any]:
    """`asp-npu export-hf`: the policy weights of a trainer checkpoint as an HF folder at `out`.

    Config and tokenizer come from the model folder the run started from (`trainer.json`'s
    model_path, or `model_dir`); nothing is written unless the whole checkpoint reads."""
    from asp_npu.arch import ModelDims
    from asp_npu.trainer.convert import full_megatron_to_hf
    from asp_npu.trainer.megatron_ckpt import read_dist

    dest = check_out_dir(out)
    meta = checkpoint_iteration(root, step)
    src = Path(model_dir or meta.get("model_path", ""))
    if not (src / "config.json").is_file():
        raise UserError(f"{meta['path']}: its model folder '{src}' (config + tokenizer) is gone: "
                        "pass --model DIR")
    dims = ModelDims.from_hf_dir(src)
    dist_dir = Path(meta["path"]) / "dist"
    if not (dist_dir / ".metadata").is_file():
        raise UserError(f"{meta['path']}: incomplete checkpoint (no dist/.metadata)")
    hf = full_megatron_to_hf(read_dist(dist_dir, "export-hf"), dims)
    dtype = next(iter(hf.values())).dtype
    info = {"source": str(Path(meta["path"]).resolve()), "step": int(meta.get("step", -1)),
            "policy_version": int(meta.get("policy_version", -1)), "model_path": str(src)}
    write_hf_folder(hf, src, dest, dtype, info, max_shard_bytes)
    return {**info, "out": str(dest), "dtype": _name(dtype), "tensors": len(hf),
            "bytes": int(sum(t.numel() * t.element_size() for t in hf.values()))}


def save_hf_folder(weights: HFWeights, src_dir: str | Path, out_dir: str | Path,
                   dtype: str = "float32") -> Path:
    """Write an HF folder (config + tokenizer of `src_dir`, the new weights as sharded safetensors in
    `dtype`) that transformers and vLLM load: the writer `asp-npu export-hf` uses. All or nothing: a
    failure leaves a previous `out_dir` as it was."""
    from asp_npu.trainer.model import DTYPES

    return write_hf_folder(weights.tensors, src_dir, out_dir, DTYPES[dtype],
                           {"source": "sft", "policy_version": weights.version})
