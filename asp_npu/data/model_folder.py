"""An HF model folder checked by reading it, before any engine or trainer process starts.

A torn download or a hand-edited file otherwise fails minutes later inside vLLM or megatron as a
traceback. Checked here, each in one UserError line naming the file:
- `config.json`: a JSON object with a `model_type` string, and the architecture numbers (sizes,
  eps, rope theta) numbers, sizes positive integers;
- every `*.safetensors`: the 8-byte header length and the JSON header fit the file, each tensor's
  dtype is known, its byte range matches its shape and lies in the file, and the last tensor ends at
  the end of the file (a truncated or padded file is caught without reading the weights);
- `model.safetensors.index.json` (sharded weights): every shard it names exists;
- the tokenizer: `tokenizer.json` loads (the `tokenizers` library, as transformers would load it),
  `tokenizer_config.json` is a JSON object.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from asp_npu.errors import UserError

SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size",
         "intermediate_size", "max_position_embeddings", "head_dim", "moe_intermediate_size",
         "num_experts", "num_experts_per_tok")
REALS = ("rms_norm_eps", "rope_theta", "layer_norm_eps", "initializer_range")
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
               "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
MAX_HEADER = 100 << 20  # the safetensors library's own limit on the JSON header


def config_problem(cfg: dict[str, Any], loadable: bool = True) -> str | None:
    """What is wrong with a parsed config.json (None: usable). `loadable`: the folder is about to be
    loaded (transformers and vLLM need `model_type`); `asp-npu check` reads only the numbers."""
    mt = cfg.get("model_type")
    if (loadable or mt is not None) and (not isinstance(mt, str) or not mt):
        return "no model_type (expected e.g. \"qwen2\")" if mt is None else f"model_type {mt!r} is not a name"
    for key in SIZES:
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            return f"{key} is {v!r}, expected a positive integer"
    for key in REALS:
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                              or v < 0):
            return f"{key} is {v!r}, expected a non-negative number"
    return None


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with the layout of a .safetensors file (None: consistent), from its header only."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{size} bytes: too short for a safetensors header"
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            return f"header length {n} does not fit the {size}-byte file (truncated?)"
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "the header is not valid JSON (corrupt or truncated)"
    if not isinstance(header, dict):
        return "the header is not a JSON object"
    return _tensors_problem(header, size - 8 - n)


def _tensors_problem(header: dict[str, Any], data_bytes: int) -> str | None:
    end = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(t, dict) or t.get("dtype") not in DTYPE_BYTES:
            return f"tensor {name!r}: unknown dtype"
        shape, offsets = t.get("shape"), t.get("data_offsets")
        if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets)):
            return f"tensor {name!r}: malformed shape or data_offsets"
        need = math.prod(shape) * DTYPE_BYTES[t["dtype"]]
        if offsets[1] - offsets[0] != need or offsets[0] < 0:
            return f"tensor {name!r}: {offsets[1] - offsets[0]} bytes for shape {shape} ({need} expected)"
        if offsets[1] > data_bytes:
            return f"tensor {name!r} ends at byte {offsets[1]}, past the end of the data (truncated?)"
        end = max(end, offsets[1])
    if end != data_bytes:
        return f"the tensors end at byte {end} of {data_bytes} data bytes (truncated or padded file)"
    return None


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    except ValueError as exc:
        raise UserError(f"{path}: not valid JSON ({str(exc).split(':')[0]})") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw


def check_weights(folder: Path) -> None:
    """Every safetensors file consistent; a sharded index names only shards that exist."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise UserError(f"{index}: no weight_map object")
        present = {p.name for p in folder.glob("*.safetensors")}
        missing = sorted({str(v) for v in weight_map.values()} - present)
        if missing:
            raise UserError(f"{index}: names the shard {missing[0]}, which is not in {folder}")
    for f in sorted(folder.glob("*.safetensors")):
        try:
            problem = safetensors_problem(f)
        except OSError as exc:
            raise UserError(f"{f}: cannot read ({exc.strerror})") from None
        if problem:
            raise UserError(f"{f}: {problem}")


def check_tokenizer(folder: Path) -> None:
    """The tokenizer files parse (and tokenizer.json loads) as transformers will need them."""
    conf = folder / "tokenizer_config.json"
    if conf.is_file():
        _read_json_object(conf)
    tok = folder / "tokenizer.json"
    if tok.is_file():
        from tokenizers import Tokenizer

        try:
            Tokenizer.from_file(str(tok))
        except Exception as exc:  # noqa: BLE001 - the Rust loader's errors have no common type
            why = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
            raise UserError(f"{tok}: the tokenizer does not load ({why})") from None


def check_config(folder: Path, loadable: bool = True) -> dict[str, Any]:
    """config.json parsed and schema-checked (`config_problem`)."""
    f = folder / "config.json"
    cfg = _read_json_object(f)
    problem = config_problem(cfg, loadable)
    if problem:
        raise UserError(f"{f}: {problem}")
    return cfg
