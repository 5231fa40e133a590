"""Tensor/pipeline/data-parallel layout: validated up front, then the process groups.

`check_layout` runs on the driver before any actor or process group exists and lists *every*
problem (TP not dividing the heads, PP larger than the layer count, world size mismatch, ...), so a
bad config costs a second, not a hung gloo/HCCL rendezvous. `init_parallel` is what each rank runs.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asp_npu.errors import ConfigError
from asp_npu.trainer.arch import arch_of_model_type, hf_arch_problems


@dataclass(frozen=True)
class ModelDims:
    """The HF config numbers that parallelism and conversion depend on (families: trainer/arch.py)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    arch: str = "qwen2"  # qwen2 | qwen3 | qwen3-moe | llama
    num_experts: int = 0  # routed experts per MoE layer (0 = dense MLP)
    moe_topk: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalise the top-k routing weights (megatron: softmax after top-k)
    rope_scaling_factor: float = 0.0  # llama3 RoPE scaling factor (0 = none)

    @property
    def qkv_bias(self) -> bool:
        return self.arch == "qwen2"

    @property
    def qk_norm(self) -> bool:
        return self.arch in ("qwen3", "qwen3-moe")

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> ModelDims:
        heads = int(cfg["num_attention_heads"])
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0)) if isinstance(rope, dict) else 10000.0
        scaled = isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) == "llama3"
        problems = hf_arch_problems(cfg, "model.path config.json")
        if problems:
            raise ConfigError("; ".join(problems))
        arch = arch_of_model_type(str(cfg.get("model_type", "qwen2")), "model.path config.json")
        moe = arch == "qwen3-moe"
        return cls(
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            vocab_size=int(cfg["vocab_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta if theta is not None else 10000.0),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            arch=arch,
            num_experts=int(cfg.get("num_experts") or cfg["num_local_experts"]) if moe else 0,
            moe_topk=int(cfg["num_experts_per_tok"]) if moe else 0,
            moe_intermediate_size=int(cfg["moe_intermediate_size"]) if moe else 0,
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)) if moe else True,
            rope_scaling_factor=float(rope.get("factor", 8.0)) if scaled else 0.0,
        )

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> ModelDims:
        """Read `config.json` of an HF folder (no transformers import: this runs on the driver)."""
        p = Path(path) / "config.json"
        if not p.is_file():
            raise ConfigError(f"model.path: '{path}' has no config.json")
        try:
            return cls.from_hf_dict(json.loads(p.read_text()))
        except ConfigError:
            raise
        except (KeyError, ValueError, TypeError) as exc:
            raise ConfigError(f"{p}: not a supported HF config ({exc})") from None


@dataclass(frozen=True)
class Layout:
    """A trainer layout in megatron-core's terms (`parallel_state.initialize_model_parallel`).

    Dense layers: TP x CP x DP x PP ranks. MoE layers fold the same ranks differently (megatron's
    "parallel folding"): experts split over `ep` ranks and each expert over `etp` ranks (None = TP),
    out of TP x CP x DP. `stages`: decoder layers per pipeline stage when they differ (MindSpeed's
    `num_layer_list` / `noop_layers`; megatron's `pipeline_model_parallel_layout`); () = even split.
    """

    tp: int
    pp: int
    dp: int
    ep: int = 1
    etp: int | None = None
    cp: int = 1
    stages: tuple[int, ...] = ()

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    def stage_sizes(self, num_layers: int) -> tuple[int, ...]:
        """Decoder layers of each pipeline stage."""
        return self.stages or (num_layers // self.pp,) * self.pp

    def stage_layers(self, num_layers: int, pp_rank: int) -> range:
        """Global layer indices held by pipeline stage `pp_rank`."""
        sizes = self.stage_sizes(num_layers)
        start = sum(sizes[:pp_rank])
        return range(start, start + sizes[pp_rank])

    def pipeline_layout(self) -> list[list[str]] | None:
        """megatron's `pipeline_model_parallel_layout` for uneven stages (None: megatron's even split)."""
        if not self.stages or self.pp == 1:
            return None
        rows = [["decoder"] * n for n in self.stages]
        rows[0].insert(0, "embedding")
        rows[-1].append("loss")
        return rows


def stage_problems(num_layers: int, pp: int, stages: list[int] | tuple[int, ...]) -> list[str]:
    """`actor_config.num_layer_list` against PP and the model's layers (empty = fine or not set)."""
    if not stages:
        return []
    if len(stages) != pp:
        return [f"actor_config.num_layer_list: {len(stages)} stages {list(stages)} but "
                f"pipeline_model_parallel_size={pp}"]
    if min(stages) < 1:
        return [f"actor_config.num_layer_list: every stage needs >= 1 layer (got {list(stages)})"]
    if num_layers and sum(stages) != num_layers:
        return [f"actor_config.num_layer_list: {'+'.join(map(str, stages))} = {sum(stages)} layers, "
                f"but the model has {num_layers}"]
    return []


def layout_problems(dims: ModelDims, tp: int, pp: int, dp: int, world_size: int | None = None,
                    ep: int = 1, etp: int | None = None, cp: int = 1,
                    stages: tuple[int, ...] = ()) -> list[str]:
    """Every reason this layout cannot run this model (empty = fine). Pure; no process group."""
    problems: list[str] = []
    for name, v in (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp),
                    ("data_parallel_size", dp), ("expert_model_parallel_size", ep),
                    ("context_parallel_size", cp)):
        if v < 1:
            problems.append(f"actor_config.{name}: must be >= 1 (got {v})")
    if problems:
        return problems
    if dims.num_heads % tp:
        problems.append(f"actor_config.tensor_model_parallel_size={tp} does not divide the "
                        f"{dims.num_heads} attention heads")
    if dims.num_kv_heads % tp:
        problems.append(f"actor_config.tensor_model_parallel_size={tp} does not divide the "
                        f"{dims.num_kv_heads} key/value heads (megatron splits whole query groups)")
    if dims.num_heads % dims.num_kv_heads:
        problems.append(f"model: {dims.num_heads} attention heads are not a multiple of "
                        f"{dims.num_kv_heads} key/value heads")
    if dims.intermediate_size % tp:
        problems.append(f"actor_config.tensor_model_parallel_size={tp} does not divide "
                        f"intermediate_size={dims.intermediate_size}")
    if stages:
        problems += stage_problems(dims.num_layers, pp, stages)
    elif pp > dims.num_layers:
        problems.append(f"actor_config.pipeline_model_parallel_size={pp} is larger than the "
                        f"{dims.num_layers} layers")
    elif dims.num_layers % pp:
        problems.append(f"actor_config.pipeline_model_parallel_size={pp} does not divide the "
                        f"{dims.num_layers} layers (set actor_config.num_layer_list for uneven stages)")
    problems += expert_problems(dims.num_experts, ep, tp * cp * dp, etp if etp is not None else tp,
                                dims.moe_intermediate_size)
    if world_size is not None and world_size != tp * pp * cp * dp:
        problems.append(f"world size {world_size} != tensor x pipeline x context x data parallel sizes = "
                        f"{tp}x{pp}x{cp}x{dp}={tp * pp * cp * dp}")
    return problems


def expert_problems(num_experts: int, ep: int, tp_cp_dp: int, etp: int = 1, moe_ffn: int = 0) -> list[str]:
    """megatron-core's expert layout rules (`initialize_model_parallel`, MoE parallel folding): experts
    split evenly over EP, each expert's FFN over ETP, and the TP x CP x DP ranks of a pipeline stage
    fold into whole ETP x EP groups (world % (ETP x EP x PP) == 0). `tp_cp_dp`: TP x CP x DP."""
    problems = []
    if ep > 1 and not num_experts:
        return [f"actor_config.expert_model_parallel_size={ep} needs a MoE model (this one is dense)"]
    if not num_experts:
        return []
    if num_experts % ep:
        problems.append(f"actor_config.expert_model_parallel_size={ep} does not divide the "
                        f"{num_experts} experts")
    if moe_ffn and moe_ffn % etp:
        problems.append(f"expert tensor parallel size {etp} does not divide moe_intermediate_size={moe_ffn}")
    if tp_cp_dp % (etp * ep):
        problems.append(f"actor_config.expert_model_parallel_size={ep} x expert tensor parallel size {etp} "
                        f"= {etp * ep} does not divide TP x CP x DP = {tp_cp_dp} (megatron folds each "
                        "pipeline stage's ranks into whole expert groups)")
    return problems


def check_layout(dims: ModelDims, tp: int, pp: int, dp: int, world_size: int | None = None,
                 ep: int = 1, etp: int | None = None, cp: int = 1,
                 stages: tuple[int, ...] = ()) -> Layout:
    """Raise one ConfigError naming every problem, before any process group starts."""
    problems = layout_problems(dims, tp, pp, dp, world_size, ep, etp, cp, stages)
    if problems:
        raise ConfigError("; ".join(problems))
    return Layout(tp, pp, dp, ep, etp, cp, tuple(stages))


def actor_layout(dims: ModelDims, act: Any, world_size: int | None = None) -> Layout:
    """The validated Layout of an `actor_config` (every parallel size and the pipeline stages)."""
    return check_layout(dims, act.tensor_model_parallel_size, act.pipeline_model_parallel_size,
                        act.data_parallel_size, world_size, act.expert_model_parallel_size,
                        expert_tp_of(act), act.context_parallel_size, tuple(act.num_layer_list))


def expert_tp_of(act: Any) -> int | None:
    """`actor_config.expert_tensor_parallel_size` (0 = megatron's default, TP)."""
    return act.expert_tensor_parallel_size or None


def rendezvous_file(master_addr: str, master_port: int, fresh: bool = False) -> Path | None:
    """Where ranks on one machine meet: a file in the temp folder (None for a network address).

    torch's TCPStore server listens on every interface whatever address it is given, so a loopback
    group rendezvouses through a FileStore instead (gloo then binds to GLOO_SOCKET_IFNAME=lo).
    `fresh`: remove a stale file a crashed run left under the same port (rank 0, before any rank starts).
    """
    import ipaddress
    import os
    import tempfile

    try:
        if not ipaddress.ip_address(master_addr).is_loopback:
            return None
    except ValueError:
        if master_addr != "localhost":
            return None
    path = Path(tempfile.gettempdir()) / f"asp_npu_rdzv_{os.getuid()}_{master_port}"
    if fresh:
        path.unlink(missing_ok=True)
    return path


def init_parallel(backend: str, rank: int, layout: Layout, master_addr: str, master_port: int,
                  seed: int, timeout_s: float = 600.0) -> None:
    """torch.distributed + megatron parallel_state + megatron's model-parallel RNG, on one rank.

    The caller has already run `asp_npu.device.prepare_megatron(kind)` (MindSpeed adaptor) and
    `asp_npu.trainer.cpu_compat.prepare(kind)` (CPU shim).
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        rdzv = rendezvous_file(master_addr, master_port)
        init_method = f"file://{rdzv}" if rdzv else f"tcp://{master_addr}:{master_port}"
        dist.init_process_group(backend=backend, init_method=init_method,
                                rank=rank, world_size=layout.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    set_layout(layout, seed)


def set_layout(layout: Layout, seed: int) -> None:
    """(Re)build megatron's parallel groups for `layout` on an initialised world; seeds its RNG."""
    from megatron.core import parallel_state, tensor_parallel

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=layout.tp,
                                             pipeline_model_parallel_size=layout.pp,
                                             context_parallel_size=layout.cp,
                                             expert_model_parallel_size=layout.ep,
                                             expert_tensor_parallel_size=layout.expert_tp)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def destroy_parallel() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
