"""Placement and memory maths for a cluster: which NPUs run which rollout instance or trainer rank,
and whether each role fits in its card's memory.

Pure arithmetic on the config (no hardware, no torch): `asp-npu check` prints it, and the launch
path can use the same placement. Memory figures are estimates for planning, not guarantees; every
formula is stated next to its code so a user can see why a layout was refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from asp_npu.config import Config
from asp_npu.pipeline.modes import instance_count

GIB = 1024**3
COLOCATED_MODES = ("mindspeed-sync", "verl-sync")  # rollout and training share every device in turn
RUNTIME_RESERVE_GIB = 3.0  # CANN/HCCL workspaces and buffers (HCCL_BUFFSIZE per comm group), allocator slack


@dataclass(frozen=True)
class Card:
    """One accelerator model as torch_npu sees it (an A3 chip shows up as two 64 GB devices)."""

    name: str
    memory_gib: float
    npus_per_node: int
    description: str


CARDS: dict[str, Card] = {
    "910b": Card("910b", 64.0, 8, "Atlas 800T A2 (Ascend 910B1-B3), 64 GB HBM per NPU, 8 NPUs per node"),
    "910b4": Card("910b4", 32.0, 8, "Atlas 800T A2 (Ascend 910B4), 32 GB HBM per NPU, 8 NPUs per node"),
    "a3": Card(
        "a3", 64.0, 16, "Atlas 800T A3 (Ascend 910C, 2 dies per chip), 64 GB HBM per die, 16 per node"
    ),
}
CARD_ALIASES = {"": "910b", "a2": "910b", "910b1": "910b", "910b2": "910b", "910b3": "910b", "910c": "a3"}


def card_for(name: str) -> Card:
    key = CARD_ALIASES.get(name.lower(), name.lower())
    if key not in CARDS:
        known = ", ".join(sorted({*CARDS, *CARD_ALIASES} - {""}))
        raise KeyError(f"unknown card '{name}' (known: {known})")
    return CARDS[key]


@dataclass(frozen=True)
class Arch:
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def layer_params(self) -> int:
        """Qwen2/Llama block: q/o (h*h), k/v (h*kv*hd) with q/k/v biases, SwiGLU MLP, two RMSNorms."""
        h, kv = self.hidden_size, self.num_key_value_heads * self.head_dim
        attn = 2 * h * h + 2 * h * kv + h + 2 * kv
        return attn + 3 * h * self.intermediate_size + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        emb = self.embedding_params * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * self.layer_params + emb + self.hidden_size


_HF_KEYS = {  # our field -> HF config.json key
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "vocab_size": "vocab_size",
    "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings",
    "tie_word_embeddings": "tie_word_embeddings",
}


def resolve_arch(cfg: Config) -> tuple[Arch | None, list[str], str]:
    """Architecture from `model.arch` (explicit values win) filled in from model.path/config.json.

    Returns (arch or None, problems, source description)."""
    given = asdict(cfg.model.arch)
    hf: dict = {}
    cfg_json = Path(cfg.model.path) / "config.json"
    source = "model.arch"
    if cfg_json.is_file():
        try:
            hf = json.loads(cfg_json.read_text())
            hf = hf.get("text_config", hf)
            source = f"{cfg_json} + model.arch" if any(given.values()) else str(cfg_json)
        except (OSError, ValueError) as exc:
            return None, [f"model.path: cannot read {cfg_json}: {exc}"], source
    values: dict = {}
    missing: list[str] = []
    for ours, theirs in _HF_KEYS.items():
        v = given[ours] or hf.get(theirs)
        if ours == "num_key_value_heads" and not v:
            v = given["num_attention_heads"] or hf.get("num_attention_heads")  # no GQA = MHA
        if ours == "tie_word_embeddings":
            v = bool(v)
        elif not v:
            missing.append(ours)
        values[ours] = v
    if missing:
        return (
            None,
            [
                f"model.arch.{', model.arch.'.join(missing)}: unknown -- set them in the config or point "
                f"model.path at an HF folder with config.json (looked for {cfg_json})"
            ],
            source,
        )
    fields_: dict[str, Any] = {k: (int(v) if k != "tie_word_embeddings" else v) for k, v in values.items()}
    arch = Arch(**fields_)
    problems = []
    if arch.hidden_size % arch.num_attention_heads:
        problems.append(
            f"model.arch: hidden_size {arch.hidden_size} is not divisible by num_attention_heads "
            f"{arch.num_attention_heads}"
        )
    if arch.num_attention_heads % arch.num_key_value_heads:
        problems.append(
            f"model.arch: num_attention_heads {arch.num_attention_heads} is not a multiple of "
            f"num_key_value_heads {arch.num_key_value_heads}"
        )
    return arch, problems, source


# ---------------------------------------------------------------- placement


@dataclass
class InstancePlacement:
    """One vLLM rollout instance: `infer_tensor_parallel_size` NPUs inside one node."""

    instance: int
    node: int
    npus: list[int]  # local NPU ids on that node (ASCEND_RT_VISIBLE_DEVICES)


@dataclass
class TrainerGroup:
    """One trainer tensor-parallel group (Megatron rank order tp, dp, pp), inside one node."""

    node: int
    npus: list[int]
    ranks: list[int]
    pp_stage: int
    dp_rank: int


@dataclass
class MemoryEstimate:
    role: str  # "trainer stage k" | "rollout instance"
    parts: dict[str, float]  # GiB per NPU
    budget_gib: float
    kv_tokens: int = 0  # rollout: KV cache capacity in tokens per instance
    notes: list[str] = field(default_factory=list)

    @property
    def total_gib(self) -> float:
        return sum(self.parts.values())


@dataclass
class Layout:
    nodes: int
    npus_per_node: int
    card: Card
    mode: str
    colocated: bool
    rollout_npus: int
    trainer_npus: int
    instances: list[InstancePlacement] = field(default_factory=list)
    trainer: list[TrainerGroup] = field(default_factory=list)
    idle: list[tuple[int, int]] = field(default_factory=list)  # (node, npu) used by nobody
    arch: Arch | None = None
    arch_source: str = ""
    memory: list[MemoryEstimate] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def total_npus(self) -> int:
        return self.nodes * self.npus_per_node

    def to_dict(self) -> dict:
        d = asdict(self)
        d["card"] = asdict(self.card)
        d["memory"] = [{**asdict(m), "total_gib": m.total_gib} for m in self.memory]
        return d


class _Allocator:
    """Hands out NPUs node by node; a block of size k never straddles two nodes."""

    def __init__(self, nodes: int, per_node: int) -> None:
        self.free = [list(range(per_node)) for _ in range(nodes)]
        self.node = 0

    def take(self, k: int) -> tuple[int, list[int]] | None:
        while self.node < len(self.free):
            if len(self.free[self.node]) >= k:
                got, self.free[self.node] = self.free[self.node][:k], self.free[self.node][k:]
                return self.node, got
            self.node += 1
        return None

    def leftover(self) -> list[tuple[int, int]]:
        return [(n, d) for n, free in enumerate(self.free) for d in free]


def _place(cfg: Config, lay: Layout, colocated: bool) -> None:
    gen, act = cfg.generate_config, cfg.actor_config
    itp, tp, pp, dp = (
        gen.infer_tensor_parallel_size,
        act.tensor_model_parallel_size,
        act.pipeline_model_parallel_size,
        act.data_parallel_size,
    )
    alloc = _Allocator(lay.nodes, lay.npus_per_node)
    for i in range(lay.rollout_npus // itp):
        got = alloc.take(itp)
        if got is None:
            lay.problems.append(
                f"placement: rollout instance {i} (infer TP{itp}) finds no {itp} free NPUs in "
                f"one node; {lay.nodes} node(s) x {lay.npus_per_node} NPUs are too few"
            )
            break
        lay.instances.append(InstancePlacement(i, got[0], got[1]))
    rollout_left = alloc.leftover()
    if colocated:
        alloc = _Allocator(lay.nodes, lay.npus_per_node)
    for g in range(dp * pp):
        got = alloc.take(tp)
        if got is None:
            lay.problems.append(
                f"placement: trainer TP group {g} (TP{tp}) finds no {tp} free NPUs in one node; "
                f"the trainer needs TP{tp} x PP{pp} x DP{dp} = {tp * pp * dp} NPUs"
            )
            break
        lay.trainer.append(TrainerGroup(got[0], got[1], list(range(g * tp, (g + 1) * tp)), g // dp, g % dp))
    left = alloc.leftover()
    lay.idle = sorted(set(left) & set(rollout_left)) if colocated else left


# ---------------------------------------------------------------- memory


def _bytes_per(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def _seq_len(cfg: Config) -> int:
    return cfg.generate_config.max_model_len or (
        cfg.rl_config.max_prompt_length + cfg.generate_config.sampling_config.max_tokens
    )


def trainer_memory(cfg: Config, arch: Arch, card: Card) -> list[MemoryEstimate]:
    """Per-NPU memory of the first and last pipeline stage (the two that differ), in GiB.

    weights: model dtype; gradients: fp32 main-grad buffer; optimizer: Adam m+v (+fp32 master copy
    when the model is 16-bit), divided by DP with the distributed optimizer. Activations follow
    Korthikanti et al. (2022) with flash attention (no s^2 term) and a SwiGLU MLP:
    per layer and micro-batch ~ s*b*(18h + 6F)/t bytes with sequence parallelism, s*b*(10h + (8h+6F)/t)
    without; full recomputation keeps only each layer's input (2sbh/t) plus one live layer. 1F1B keeps
    min(PP, micro-batches) micro-batches in flight on stage 0. The last stage adds fp32 logits and their
    gradient (2 * 4 * s*b*V/t). A reference model (kl_coef > 0) adds one more copy of the weights."""
    act, rl = cfg.actor_config, cfg.rl_config
    tp, pp, dp, mbs = (
        act.tensor_model_parallel_size,
        act.pipeline_model_parallel_size,
        act.data_parallel_size,
        act.micro_batch_size,
    )
    wb = _bytes_per(cfg.model.dtype)
    opt_b = 8 + (4 if wb == 2 else 0)
    opt_div = dp if act.use_distributed_optimizer else 1
    s, h, f, v = _seq_len(cfg), arch.hidden_size, arch.intermediate_size, arch.vocab_size
    layers = math.ceil(arch.num_layers / pp)
    if act.sequence_parallel and tp > 1:
        per_layer = s * mbs * (18 * h + 6 * f) / tp
    else:
        per_layer = s * mbs * (10 * h + (8 * h + 6 * f) / tp)
    n_micro = max(1, rl.mini_batch_size // max(1, dp * mbs))
    out = []
    for stage, name in ((0, "first"), (pp - 1, "last")):
        params: float = layers * arch.layer_params
        if stage == 0:
            params += arch.embedding_params
        if stage == pp - 1:
            params += arch.embedding_params if (pp > 1 or not arch.tie_word_embeddings) else 0
        params /= tp
        in_flight = min(pp - stage, n_micro)
        if act.recompute_granularity == "full":
            acts = in_flight * layers * 2 * s * mbs * h / (tp if act.sequence_parallel else 1) + per_layer
        else:
            acts = in_flight * layers * per_layer
        parts = {
            "weights": params * wb / GIB,
            "gradients": params * 4 / GIB,
            "optimizer": params * opt_b / opt_div / GIB,
            "activations": acts / GIB,
            "logits": (8 * s * mbs * v / tp / GIB) if stage == pp - 1 else 0.0,
            "reference": (params * wb / GIB) if rl.kl_coef > 0 else 0.0,
            "runtime": RUNTIME_RESERVE_GIB,
        }
        out.append(
            MemoryEstimate(f"trainer stage {stage} ({name})" if pp > 1 else "trainer", parts, card.memory_gib)
        )
        if pp == 1:
            break
    return out


def instance_memory(cfg: Config, arch: Arch, card: Card) -> MemoryEstimate:
    """Per-NPU memory of one vLLM instance: weights/TP, the profile-run workspace (a full
    max_num_batched_tokens forward plus fp32 sampler logits for max_num_seqs), and whatever is left of
    gpu_memory_utilization * card becomes KV cache: 2 (K,V) * layers * kv_heads/TP * head_dim * 2 bytes
    per token, kv heads replicated when TP exceeds them."""
    gen = cfg.generate_config
    tp = gen.infer_tensor_parallel_size
    wb = _bytes_per(cfg.model.dtype)
    h, f = arch.hidden_size, arch.intermediate_size
    weights = arch.params * wb / tp
    workspace = (
        gen.max_num_batched_tokens * (4 * h + 2 * f / tp) * wb + gen.max_num_seqs * arch.vocab_size * 4
    )
    budget = gen.gpu_memory_utilization * card.memory_gib * GIB
    kv_heads = max(1, arch.num_key_value_heads // tp)
    kv_per_token = 2 * arch.num_layers * kv_heads * arch.head_dim * wb
    kv = max(0.0, budget - weights - workspace - RUNTIME_RESERVE_GIB * GIB)
    tokens = int(kv // kv_per_token)
    est = MemoryEstimate(
        "rollout instance",
        {
            "weights": weights / GIB,
            "workspace": workspace / GIB,
            "kv_cache": kv / GIB,
            "runtime": RUNTIME_RESERVE_GIB,
        },
        budget / GIB,
        kv_tokens=tokens,
    )
    est.notes.append(
        f"KV cache {tokens:,} tokens = {tokens // max(1, _seq_len(cfg))} full-length sequences "
        f"(max_num_seqs {gen.max_num_seqs})"
    )
    return est


# ---------------------------------------------------------------- the whole check


def _divisibility(cfg: Config, arch: Arch, lay: Layout) -> None:
    act, gen = cfg.actor_config, cfg.generate_config
    tp, pp, itp = (
        act.tensor_model_parallel_size,
        act.pipeline_model_parallel_size,
        gen.infer_tensor_parallel_size,
    )
    p = lay.problems
    if arch.num_attention_heads % tp:
        p.append(
            f"actor_config.tensor_model_parallel_size: TP{tp} does not divide num_attention_heads "
            f"{arch.num_attention_heads}"
        )
    if arch.num_key_value_heads % tp:
        p.append(
            f"actor_config.tensor_model_parallel_size: TP{tp} does not divide num_key_value_heads "
            f"{arch.num_key_value_heads} (Megatron num_query_groups)"
        )
    if arch.num_layers % pp:
        p.append(
            f"actor_config.pipeline_model_parallel_size: PP{pp} does not divide num_layers {arch.num_layers}"
        )
    if arch.num_attention_heads % itp:
        p.append(
            f"generate_config.infer_tensor_parallel_size: TP{itp} does not divide num_attention_heads "
            f"{arch.num_attention_heads}"
        )
    if arch.num_key_value_heads % itp and itp % arch.num_key_value_heads:
        p.append(
            f"generate_config.infer_tensor_parallel_size: TP{itp} and num_key_value_heads "
            f"{arch.num_key_value_heads} must divide one another"
        )
    for name, k in (
        ("actor_config.tensor_model_parallel_size", tp),
        ("generate_config.infer_tensor_parallel_size", itp),
    ):
        if k > lay.npus_per_node or lay.npus_per_node % k:
            p.append(
                f"{name}: TP{k} must divide the {lay.npus_per_node} NPUs of a node (a TP group stays in one "
                f"node, on HCCS)"
            )
    s = _seq_len(cfg)
    need = cfg.rl_config.max_prompt_length + gen.sampling_config.max_tokens
    if gen.max_model_len and gen.max_model_len < need:
        p.append(
            f"generate_config.max_model_len: {gen.max_model_len} < max_prompt_length + max_tokens = {need}"
        )
    if s > arch.max_position_embeddings:
        p.append(
            f"generate_config.max_model_len: {s} tokens exceed the model's max_position_embeddings "
            f"{arch.max_position_embeddings}"
        )


def _batches(cfg: Config, lay: Layout) -> None:
    act, rl, gen = cfg.actor_config, cfg.rl_config, cfg.generate_config
    p = lay.problems
    step = act.data_parallel_size * act.micro_batch_size
    if rl.mini_batch_size % step:
        p.append(
            f"rl_config.mini_batch_size: {rl.mini_batch_size} samples are not divisible by "
            f"DP{act.data_parallel_size} x micro_batch_size {act.micro_batch_size} = {step}"
        )
    if rl.global_batch_size and (rl.global_batch_size * rl.n_samples_per_prompt) % rl.mini_batch_size:
        p.append(
            f"rl_config.global_batch_size: {rl.global_batch_size} prompts x n {rl.n_samples_per_prompt} is "
            f"not a whole number of minibatches of {rl.mini_batch_size} samples"
        )
    if lay.colocated:
        if rl.max_lag:
            lay.warnings.append(
                f"rl_config.max_lag={rl.max_lag} is ignored by the synchronous mode {lay.mode}"
            )
        return
    window = (rl.max_lag + 1) * rl.mini_batch_size
    if window < gen.num_instances * rl.n_samples_per_prompt:
        p.append(
            f"rl_config.max_lag: the lag bound admits (max_lag+1) x mini_batch_size = {window} samples in "
            f"flight, fewer than one group of {rl.n_samples_per_prompt} for each of the {gen.num_instances} "
            "instances;"
            f" raise max_lag or mini_batch_size, or use fewer instances"
        )
    elif window < gen.num_instances * gen.max_num_seqs:
        lay.warnings.append(
            f"the lag bound admits {window} samples in flight for {gen.num_instances} instances x "
            f"max_num_seqs {gen.max_num_seqs}: instances will run below their batch capacity"
        )


def _memory(cfg: Config, arch: Arch, lay: Layout) -> None:
    gen = cfg.generate_config
    if not 0 < gen.gpu_memory_utilization <= 1:
        lay.problems.append(
            f"generate_config.gpu_memory_utilization: {gen.gpu_memory_utilization} is not in (0, 1]"
        )
        return
    inst = instance_memory(cfg, arch, lay.card)
    lay.memory.append(inst)
    if inst.kv_tokens < _seq_len(cfg):
        lay.problems.append(
            f"memory: a rollout instance (infer TP{gen.infer_tensor_parallel_size}) needs weights "
            f"{inst.parts['weights']:.1f} + workspace {inst.parts['workspace']:.1f} + runtime "
            f"{RUNTIME_RESERVE_GIB:.0f} GiB per NPU and leaves KV cache for {inst.kv_tokens:,} tokens, "
            f"less than one sequence of {_seq_len(cfg)}, within gpu_memory_utilization "
            f"{gen.gpu_memory_utilization} x {lay.card.memory_gib:.0f} GiB; raise infer_tensor_parallel_size "
            "or gpu_memory_utilization"
        )
    elif inst.kv_tokens < gen.max_num_seqs * _seq_len(cfg) // 4:
        lay.warnings.append(
            f"rollout KV cache holds {inst.kv_tokens:,} tokens: max_num_seqs {gen.max_num_seqs} will "
            f"be limited by KV space once responses grow"
        )
    for est in trainer_memory(cfg, arch, lay.card):
        lay.memory.append(est)
        if est.total_gib > est.budget_gib:
            lay.problems.append(
                f"memory: {est.role} needs ~{est.total_gib:.1f} GiB per NPU ("
                + ", ".join(f"{k} {v:.1f}" for k, v in est.parts.items() if v)
                + f") > {est.budget_gib:.0f} GiB per {lay.card.name}; raise TP/PP, set "
                "use_distributed_optimizer with DP > 1, recompute_granularity=full, or a smaller "
                "micro_batch_size"
            )
    if not lay.colocated and gen.gpu_memory_utilization < 0.7:
        lay.warnings.append(
            f"generate_config.gpu_memory_utilization {gen.gpu_memory_utilization}: rollout NPUs are not"
            " shared with training in this mode; 0.85-0.9 gives the KV cache the rest"
        )


def plan_layout(cfg: Config, nodes: int, npus_per_node: int, card: Card) -> Layout:
    """Place instances and trainer ranks on `nodes` x `npus_per_node` NPUs and list every problem."""
    gen, act = cfg.generate_config, cfg.actor_config
    colocated = cfg.rl_config.mode in COLOCATED_MODES
    instances = instance_count(cfg, colocated, nodes * npus_per_node)
    rollout = instances * gen.infer_tensor_parallel_size
    trainer = act.tensor_model_parallel_size * act.pipeline_model_parallel_size * act.data_parallel_size
    lay = Layout(nodes, npus_per_node, card, cfg.rl_config.mode, colocated, rollout, trainer)
    if npus_per_node > card.npus_per_node:
        lay.problems.append(
            f"cluster: {npus_per_node} NPUs per node, but a {card.name} node has {card.npus_per_node}"
        )
    need = max(rollout, trainer) if colocated else rollout + trainer
    if need > lay.total_npus:
        what = "max" if colocated else "sum"
        lay.problems.append(
            f"cluster: the config needs {need} NPUs ({what} of rollout {instances} instances x "
            f"infer TP{gen.infer_tensor_parallel_size} = {rollout} and trainer "
            f"TP{act.tensor_model_parallel_size} x PP{act.pipeline_model_parallel_size} x "
            f"DP{act.data_parallel_size} = {trainer}) but {nodes} node(s) x {npus_per_node} NPUs = "
            f"{lay.total_npus}"
        )
    else:
        _place(cfg, lay, colocated)
    if colocated and rollout != trainer:
        lay.warnings.append(
            f"{lay.mode}: rollout uses {rollout} NPUs and training {trainer}; the rest idle in one phase"
        )
    arch, problems, source = resolve_arch(cfg)
    lay.arch, lay.arch_source = arch, source
    lay.problems += problems
    _batches(cfg, lay)
    if arch is not None and not problems:
        _divisibility(cfg, arch, lay)
        _memory(cfg, arch, lay)
    if lay.idle and not lay.problems:
        lay.warnings.append(
            f"{len(lay.idle)} NPU(s) unused: "
            + ", ".join(f"node {n} NPU {d}" for n, d in lay.idle[:8])
            + (" ..." if len(lay.idle) > 8 else "")
        )
    return lay
