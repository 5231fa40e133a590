"""A trainer layout in megatron-core's terms and every rule it must satisfy for a model (pure; runs on the
driver before any process group exists, listing every problem: TP not dividing the heads, PP larger than
the layer count, a world size mismatch, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asp_npu.arch import ModelDims
from asp_npu.errors import ConfigError


@dataclass(frozen=True)
class ParallelLayout:
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
    if dims.num_attention_heads % tp:
        problems.append(f"actor_config.tensor_model_parallel_size={tp} does not divide the "
                        f"{dims.num_attention_heads} attention heads")
    if dims.num_key_value_heads % tp:
        problems.append(f"actor_config.tensor_model_parallel_size={tp} does not divide the "
                        f"{dims.num_key_value_heads} key/value heads (megatron splits whole query groups)")
    if dims.num_attention_heads % dims.num_key_value_heads:
        problems.append(f"model: {dims.num_attention_heads} attention heads are not a multiple of "
                        f"{dims.num_key_value_heads} key/value heads")
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
                                dims.moe_ffn_hidden_size)
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
                 stages: tuple[int, ...] = ()) -> ParallelLayout:
    """Raise one ConfigError naming every problem, before any process group starts."""
    problems = layout_problems(dims, tp, pp, dp, world_size, ep, etp, cp, stages)
    if problems:
        raise ConfigError("; ".join(problems))
    return ParallelLayout(tp, pp, dp, ep, etp, cp, tuple(stages))


def actor_layout(dims: ModelDims, act: Any, world_size: int | None = None) -> ParallelLayout:
    """The validated ParallelLayout of an `actor_config` (every parallel size and the pipeline stages)."""
    return check_layout(dims, act.tensor_model_parallel_size, act.pipeline_model_parallel_size,
                        act.data_parallel_size, world_size, act.expert_model_parallel_size,
                        expert_tp_of(act), act.context_parallel_size, tuple(act.num_layer_list))


def expert_tp_of(act: Any) -> int | None:
    """`actor_config.expert_tensor_parallel_size` (0 = megatron's default, TP)."""
    return act.expert_tensor_parallel_size or None
