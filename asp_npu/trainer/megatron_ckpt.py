"""Megatron weights written by Megatron-LM / MindSpeed-LLM (any TP/PP/EP) as full HF tensors.

`model.load_megatron` (or a MindSpeed-RL `actor_config.load` naming such a folder) starts the policy
from them; `asp-npu export-hf` reads our own checkpoints through the same path. Two layouts:
- legacy (`--ckpt-format torch`): `latest_checkpointed_iteration.txt` names `iter_<n:07d>/` (or
  `release/`), holding one `mp_rank_<tp:02d>[_<pp:03d>][_<ep:03d>]/model_optim_rng.pt` per model-parallel
  rank: a `torch.save`d dict whose `model` (`model0`, `model1`, ... with virtual pipeline stages) is
  that rank's megatron-core state dict (local layer numbers, TP shards);
- megatron-core dist checkpoints (`torch_dist`, what our own `iter_<step>/dist` is): `metadata.json`
  and torch DCP shards; every tensor is stored in global (TP=1) coordinates, layers stacked.

Both become one TP=1 state dict with global layer and expert numbers (`full_megatron_to_hf` then
names it HF). TP shards merge by how megatron splits them: rows for the vocabulary, `linear_qkv`
(whole query groups per rank) and column-parallel outputs, columns for the row-parallel
`linear_proj`/`linear_fc2`, and `linear_fc1` as [gate shard; up shard] per rank; norms and routers are
replicated. Pipeline stages (and virtual chunks, chunk-major) are stacked by counting their layers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asp_npu.arch import ModelDims
from asp_npu.data.megatron_folder import MegatronFolder, dims_problems, locate
from asp_npu.errors import UserError

if TYPE_CHECKING:  # torch is imported where tensors are read: config validation checks names only
    import torch

# megatron-core's TE-style names for the layer norms fused into the next linear (dist checkpoints
# always use them; a Transformer-Engine layer spec does in its state dict too)
_TE_NAMES = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
             "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight"}
_MODEL_PREFIXES = ("embedding.", "decoder.", "output_layer.")


def read_megatron(path: str | Path, dims: ModelDims,
                  what: str = "model.load_megatron") -> dict[str, torch.Tensor]:
    """Full HF tensors of the Megatron checkpoint at `path` (any TP/PP/EP, legacy or dist)."""
    from asp_npu.trainer.convert import full_megatron_to_hf

    folder = locate(path, what)
    problems = dims_problems(folder, dims, what)
    if problems:
        raise UserError(problems[0])
    full = read_legacy(folder, dims, what) if folder.layout == "legacy" else read_dist(folder.path, what)
    _check_shapes(full, dims, folder.path, what)
    return full_megatron_to_hf(full, dims)


def _check_shapes(full: Mapping[str, torch.Tensor], dims: ModelDims, where: Path, what: str) -> None:
    """One line, not a tensor error deep in the conversion, when the weights are another model's."""
    layers = {int(m[1]) for k in full if (m := re.match(r"decoder\.layers\.(\d+)\.", k))}
    if len(layers) != dims.num_layers:
        raise UserError(f"{what}: {where} has {len(layers)} decoder layers; model.path has {dims.num_layers}")
    qkv = full.get("decoder.layers.0.self_attention.linear_qkv.weight")
    rows = (dims.num_attention_heads + 2 * dims.num_key_value_heads) * dims.head_dim
    if qkv is None or tuple(qkv.shape) != (rows, dims.hidden_size):
        got = None if qkv is None else tuple(qkv.shape)
        raise UserError(f"{what}: {where}: linear_qkv is {got}, model.path's heads need ({rows}, "
                        f"{dims.hidden_size})")
    emb = full.get("embedding.word_embeddings.weight")
    if emb is None or emb.shape[0] < dims.vocab_size:
        raise UserError(f"{what}: {where}: the embedding has {None if emb is None else emb.shape[0]} rows, "
                        f"fewer than model.path's vocabulary of {dims.vocab_size}")


# ------------------------------------------------------------------ legacy layout
def _load_rank(f: Path, what: str) -> dict[str, Any]:
    """One rank's file. Megatron pickles its `args` namespace (enums, dtypes) next to the tensors, so
    this is a full unpickle, the same trust Megatron's own loader gives its checkpoint folder."""
    import torch

    try:
        state = torch.load(f, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - a torn or foreign file: one line
        raise UserError(f"{what}: {f} cannot be read ({str(exc).splitlines()[0][:120]})") from None
    if not isinstance(state, dict) or not any(k == "model" or re.fullmatch(r"model\d+", k) for k in state):
        raise UserError(f"{what}: {f} holds no 'model' state dict")
    return state


def _chunks(state: Mapping[str, Any]) -> list[dict[str, torch.Tensor]]:
    """The rank's model chunks (one, or one per virtual pipeline stage), megatron-core names."""
    import torch

    keys = ["model"] if "model" in state else sorted((k for k in state if re.fullmatch(r"model\d+", k)),
                                                     key=lambda k: int(k[5:]))
    return [{_te_to_local(k): v for k, v in state[k].items()
             if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")} for k in keys]


def _te_to_local(name: str) -> str:
    for te, local in _TE_NAMES.items():
        if name.endswith(te):
            return name[: -len(te)] + local
    return name


def _args_layout(state: Mapping[str, Any]) -> tuple[int, int, int] | None:
    args = state.get("args")
    if args is None:
        return None
    return (int(getattr(args, "tensor_model_parallel_size", 1) or 1),
            int(getattr(args, "pipeline_model_parallel_size", 1) or 1),
            int(getattr(args, "expert_model_parallel_size", 1) or 1))


def read_legacy(folder: MegatronFolder, dims: ModelDims, what: str) -> dict[str, torch.Tensor]:
    """Merge every rank of a legacy-layout iteration into one TP=1 state dict (global numbering)."""
    ranks = dict(folder.ranks)
    first = _load_rank(ranks[(0, 0, 0)], what)
    declared = _args_layout(first)
    grid = (folder.tp, folder.pp, folder.ep)
    if declared is not None and declared[2] > 1 and declared[1] == 1 and folder.ep == 1:
        ranks = {(t, 0, p): f for (t, p, _), f in ranks.items()}  # mp_rank_TT_EEE: no PP, only EP
        grid = (folder.tp, 1, 1 + max(r[2] for r in ranks))
    if declared is not None and declared != grid:
        raise UserError(f"{what}: {folder.path} holds ranks for TP={grid[0]} x PP={grid[1]} x "
                        f"EP={grid[2]}, its args say TP={declared[0]} x PP={declared[1]} x EP={declared[2]}: "
                        "ranks are missing")
    tp, pp, ep = grid
    chunks: dict[tuple[int, int], list[list[dict[str, torch.Tensor]]]] = {}  # (chunk, pp) -> [ep][tp]
    for p in range(pp):
        for e in range(ep):
            per_tp = [_chunks(first if (t, p, e) == (0, 0, 0) else _load_rank(ranks[(t, p, e)], what))
                      for t in range(tp)]
            for c in range(len(per_tp[0])):
                chunks.setdefault((c, p), []).append([r[c] for r in per_tp])
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for key in sorted(chunks):  # chunk-major: megatron's virtual pipeline order of layers
        merged = _merge_stage(chunks[key], dims, what)
        n = _count_layers(merged)
        out.update(_renumber(merged, offset))
        offset += n
    return out


def _count_layers(sd: Mapping[str, torch.Tensor]) -> int:
    idx = {int(m[1]) for k in sd if (m := re.match(r"decoder\.layers\.(\d+)\.", k))}
    return 1 + max(idx) if idx else 0


def _renumber(sd: Mapping[str, torch.Tensor], offset: int) -> dict[str, torch.Tensor]:
    def rename(k: str) -> str:
        return re.sub(r"^decoder\.layers\.(\d+)\.", lambda m: f"decoder.layers.{int(m[1]) + offset}.", k)

    return {rename(k): v for k, v in sd.items()}


def _merge_stage(per_ep: list[list[dict[str, torch.Tensor]]], dims: ModelDims,
                 what: str) -> dict[str, torch.Tensor]:
    """One pipeline stage: TP shards merged; experts of EP rank e renumbered e * local + j."""
    out: dict[str, torch.Tensor] = {}
    for e, per_tp in enumerate(per_ep):
        n_local = dims.num_experts // len(per_ep) if dims.num_experts else 0
        for name in per_tp[0]:
            m = re.search(r"\.local_experts\.(\d+)\.", name)
            if m is None and e > 0:
                continue  # dense parts are replicated over EP
            merged = merge_tp(name, [sd[name] for sd in per_tp], what)
            if m is not None:
                name = name.replace(m[0], f".local_experts.{e * n_local + int(m[1])}.")
            out[name] = merged
    return out


_ROWS = ("word_embeddings.weight", "output_layer.weight", "linear_qkv.weight", "linear_qkv.bias")
_COLUMNS = ("linear_proj.weight", "linear_fc2.weight")
_REPLICATED = ("layernorm.weight", "layernorm.bias", "router.weight", "router.expert_bias",
               "linear_proj.bias", "linear_fc2.bias")


def merge_tp(name: str, shards: list[torch.Tensor], what: str = "model.load_megatron") -> torch.Tensor:
    """One tensor's TP shards (rank order) -> the TP=1 tensor, by how megatron-core splits `name`."""
    import torch

    if len(shards) == 1:
        return shards[0]
    if name.endswith(_ROWS):
        return torch.cat(shards)
    if name.endswith(_COLUMNS):
        return torch.cat(shards, dim=1)
    if name.endswith(("linear_fc1.weight", "linear_fc1.bias")):
        halves = [s.chunk(2) for s in shards]  # each rank: [gate shard; up shard]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    if name.endswith(_REPLICATED) or name.endswith("norm.weight"):
        return shards[0]
    raise UserError(f"{what}: tensor '{name}' is not a megatron-core GPT parameter asp-npu converts "
                    "(a legacy non-mcore model? convert it with MindSpeed-LLM's --use-mcore-models)")


# ------------------------------------------------------------------ dist checkpoints
def read_dist(path: str | Path, what: str = "model.load_megatron") -> dict[str, torch.Tensor]:
    """The model tensors of a megatron-core dist checkpoint folder, TP=1 names with global numbering
    (optimizer state is not read)."""
    from megatron.core import dist_checkpointing

    d = str(path)
    with _process_group():
        try:
            meta = dist_checkpointing.load_tensors_metadata(d)
            wanted = {k: v for k, v in meta.items() if k.startswith(_MODEL_PREFIXES)}
            for sh in wanted.values():
                sh.init_data("cpu")
            loaded = dist_checkpointing.load(wanted, d, validate_access_integrity=False)
        except Exception as exc:  # noqa: BLE001 - torn shards, a foreign format: one line
            raise UserError(f"{what}: {path} cannot be read as a dist checkpoint "
                            f"({str(exc).splitlines()[0][:160]})") from None
    return unstack(loaded)


def unstack(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Dist-checkpoint names -> per-layer / per-expert megatron state-dict names: layers stacked on a
    leading axis (`decoder.layers.X`) and experts on the next (`mlp.experts.X`) are split out."""
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        k = _te_to_local(k)
        if k.startswith("decoder.layers.") and not re.match(r"decoder\.layers\.\d+\.", k):
            rest = k[len("decoder.layers."):]
            for i, t in enumerate(v.unbind(0)):
                out.update(_experts_split(f"decoder.layers.{i}.{rest}", t))
        else:
            out.update(_experts_split(k, v))
    return out


def _experts_split(k: str, v: torch.Tensor) -> dict[str, torch.Tensor]:
    m = re.match(r"(.*\.mlp\.experts\.)(\d+\.)?(?!local_experts)(.*)$", k)
    if m is None or "local_experts." in k:
        return {k: v}
    if m[2]:
        return {f"{m[1]}local_experts.{m[2]}{m[3]}": v}
    return {f"{m[1]}local_experts.{e}.{m[3]}": t for e, t in enumerate(v.unbind(0))}


class _process_group:
    """A one-process gloo group for megatron's checkpoint reader when none is running (the CLI), with
    the device preparation the trainer does (megatron's reader calls torch.cuda); inside the trainer
    every rank reads and the trainer's own group serves."""

    def __enter__(self) -> None:
        import torch.distributed as dist

        from asp_npu import device
        from asp_npu.trainer import cpu_compat

        self.mine = not dist.is_initialized()
        if self.mine:
            kind = device.detect("auto")
            device.prepare_megatron(kind)
            cpu_compat.prepare(kind)
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    def __exit__(self, *exc: object) -> None:
        import torch.distributed as dist

        if self.mine:
            dist.destroy_process_group()


def initial_weights(model_path: str | Path, dims: ModelDims,
                    load_megatron: str = "") -> dict[str, torch.Tensor]:
    """The full HF tensors a trainer starts from: the Megatron checkpoint `model.load_megatron` names
    (any TP/PP, merged), else the HF folder's own weights."""
    if load_megatron:
        return read_megatron(load_megatron, dims)
    from asp_npu.trainer.convert import read_hf_state

    return read_hf_state(model_path)
