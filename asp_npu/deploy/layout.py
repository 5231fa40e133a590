"""Placement and memory maths for a cluster: which NPUs run which rollout instance or trainer rank,
and whether each role fits in its card's memory.

Pure arithmetic on the config (no hardware, no torch): `asp-npu check` prints it, and the launch
path can use the same placement. Memory figures are estimates for planning, not guarantees; every
formula is stated next to its code so a user can see why a layout was refused.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from asp_npu.arch import ModelDims
from asp_npu.config import COLOCATED_MODES, Config, critic_dp
from asp_npu.core.layout import stage_problems
from asp_npu.core.shape import trainer_world
from asp_npu.deploy.arch import TRAINER_CANNOT_BUILD, resolve_arch
from asp_npu.deploy.memory import (
    GIB,
    RUNTIME_RESERVE_GIB,
    Card,
    MemoryEstimate,
    critic_memory,
    instance_memory,
    instance_npus,
    seq_len,
    trainer_memory,
    trainer_resident_gib,
)

__all__ = [
    "COLOCATED_MODES",
    "GIB",
    "ModelDims",
    "Card",
    "Deployment",
    "MemoryEstimate",
    "card_for",
    "instance_memory",
    "BundleGroup",
    "place",
    "plan_layout",
    "ray_groups",
    "resolve_arch",
    "trainer_memory",
]



# host_memory_gib: the typical shipped configuration of each server (A2: 1 TB DDR, A3: 2 TB DDR), not a
# specification -- set trainer.host_memory_gib to what `free -g` says on yours
CARDS: dict[str, Card] = {
    "910b": Card("910b", 64.0, 8, "Atlas 800T A2 (Ascend 910B1-B3), 64 GB HBM per NPU, 8 NPUs per node",
                 1024.0),
    "910b4": Card("910b4", 32.0, 8, "Atlas 800T A2 (Ascend 910B4), 32 GB HBM per NPU, 8 NPUs per node",
                  1024.0),
    "a3": Card(
        "a3", 64.0, 16, "Atlas 800T A3 (Ascend 910C, 2 dies per chip), 64 GB HBM per die, 16 per node", 2048.0
    ),
}
# what else lives in a node's host memory: Ray's object store (30% of it by default, at most 200 GB) and the
# OS, the driver, the data loader and vLLM's host side (32 GiB)
RAY_OBJECT_STORE_FRACTION, RAY_OBJECT_STORE_MAX_GIB, HOST_OS_RESERVE_GIB = 0.3, 200e9 / GIB, 32.0
CARD_ALIASES = {"": "910b", "a2": "910b", "910b1": "910b", "910b2": "910b", "910b3": "910b", "910c": "a3"}


def card_for(name: str) -> Card:
    key = CARD_ALIASES.get(name.lower(), name.lower())
    if key not in CARDS:
        known = ", ".join(sorted({*CARDS, *CARD_ALIASES} - {""}))
        raise KeyError(f"unknown card '{name}' (known: {known})")
    return CARDS[key]


# ---------------------------------------------------------------- placement


@dataclass
class InstancePlacement:
    """One vLLM rollout instance: `infer_tensor_parallel_size` NPUs inside one node, or its expert-parallel
    group (`infer_expert_parallel_size` NPUs: vLLM TP x DP ranks) when that is larger."""

    instance: int
    node: int  # first node
    npus: list[int]  # local NPU ids on that node (ASCEND_RT_VISIBLE_DEVICES), the same on each node it spans
    span_nodes: int = 1  # > 1: an expert-parallel instance over whole nodes


@dataclass
class TrainerPlacement:
    """One trainer tensor-parallel group (Megatron rank order tp, dp, pp), inside one node."""

    node: int
    npus: list[int]
    ranks: list[int]
    pp_stage: int
    dp_rank: int


@dataclass
class Deployment:
    nodes: int
    npus_per_node: int
    card: Card
    mode: str
    colocated: bool
    rollout_npus: int
    trainer_npus: int
    instances: list[InstancePlacement] = field(default_factory=list)
    trainer: list[TrainerPlacement] = field(default_factory=list)
    idle: list[tuple[int, int]] = field(default_factory=list)  # (node, npu) used by nobody
    arch: ModelDims | None = None
    arch_source: str = ""
    memory: list[MemoryEstimate] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    host_gib_per_node: float = 0.0  # the fullest node's host memory for the job's own state (optimizer)
    host_budget_gib: float = 0.0  # what is left of the node's host memory for it (0 = not checked)

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
        self.per_node = per_node
        self.node = 0

    def take(self, k: int) -> tuple[int, list[int]] | None:
        while self.node < len(self.free):
            if len(self.free[self.node]) >= k:
                got, self.free[self.node] = self.free[self.node][:k], self.free[self.node][k:]
                return self.node, got
            self.node += 1
        return None

    def take_nodes(self, n: int) -> tuple[int, list[int]] | None:
        """`n` consecutive whole free nodes (an expert-parallel instance larger than a node)."""
        for start in range(self.node, len(self.free) - n + 1):
            if all(len(self.free[j]) == self.per_node for j in range(start, start + n)):
                got = list(self.free[start])
                for j in range(start, start + n):
                    self.free[j] = []
                return start, got
        return None

    def leftover(self) -> list[tuple[int, int]]:
        return [(n, d) for n, free in enumerate(self.free) for d in free]


def _place(cfg: Config, lay: Deployment, colocated: bool) -> None:
    act = cfg.actor_config
    k, tp, pp, dp = (
        instance_npus(cfg),
        act.tensor_model_parallel_size,
        act.pipeline_model_parallel_size,
        act.data_parallel_size * act.context_parallel_size,  # CP ranks are placed like DP ranks
    )
    alloc = _Allocator(lay.nodes, lay.npus_per_node)
    for i in range(lay.rollout_npus // k):
        got = alloc.take(k) if k <= lay.npus_per_node else alloc.take_nodes(k // lay.npus_per_node)
        if got is None:
            lay.problems.append(
                f"placement: rollout instance {i} ({k} NPUs) finds no {k} free NPUs "
                f"{'in one node' if k <= lay.npus_per_node else 'on whole free nodes'}; "
                f"{lay.nodes} node(s) x {lay.npus_per_node} NPUs are too few"
            )
            break
        lay.instances.append(InstancePlacement(i, got[0], got[1], max(1, k // lay.npus_per_node)))
    rollout_left = alloc.leftover()
    if colocated:
        alloc = _Allocator(lay.nodes, lay.npus_per_node)
    for g in range(dp * pp):
        got = alloc.take(tp)
        if got is None:
            lay.problems.append(
                f"placement: trainer TP group {g} (TP{tp}) finds no {tp} free NPUs in one node; "
                f"the trainer needs TP{tp} x PP{pp} x CP x DP = {tp * pp * dp} NPUs"
            )
            break
        devices = list(range(g * tp, (g + 1) * tp))
        lay.trainer.append(TrainerPlacement(got[0], got[1], devices, g // dp, g % dp))
    left = alloc.leftover()
    lay.idle = sorted(set(left) & set(rollout_left)) if colocated else left


# ---------------------------------------------------------------- the whole check


def _divisibility(cfg: Config, arch: ModelDims, lay: Deployment) -> None:
    lay.problems += _trainer_divisibility(cfg, arch)
    lay.problems += _rollout_divisibility(cfg, arch, lay.npus_per_node)
    lay.problems += _tp_in_node(cfg, lay.npus_per_node)
    lay.problems += _length_problems(cfg, arch)


def _trainer_divisibility(cfg: Config, arch: ModelDims) -> list[str]:
    """Megatron-core splits heads over TP and layers over PP stages; an uneven split fails at model build."""
    act = cfg.actor_config
    tp, pp = act.tensor_model_parallel_size, act.pipeline_model_parallel_size
    p: list[str] = []
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
    if act.num_layer_list:
        p += stage_problems(arch.num_layers, pp, act.num_layer_list)
    elif arch.num_layers % pp:
        p.append(
            f"actor_config.pipeline_model_parallel_size: PP{pp} does not divide num_layers "
            f"{arch.num_layers}; set actor_config.num_layer_list for uneven stages"
        )
    return p


def _rollout_divisibility(cfg: Config, arch: ModelDims, npus_per_node: int) -> list[str]:
    """vLLM's expert and tensor parallel sizes against the model's experts and heads, found before launch."""
    gen = cfg.generate_config
    itp, iep = gen.infer_tensor_parallel_size, gen.infer_expert_parallel_size
    p: list[str] = []
    # training EP vs experts and DP: `config.validate` (trainer.parallel.expert_problems)
    if iep > 1 and not arch.moe:
        p.append(f"generate_config.infer_expert_parallel_size: {iep} on a dense model (no experts)")
    elif arch.moe and arch.num_experts % iep:
        p.append(
            f"generate_config.infer_expert_parallel_size: {iep} does not divide the "
            f"{arch.num_experts} experts"
        )
    if iep > npus_per_node and iep % npus_per_node:
        p.append(
            f"generate_config.infer_expert_parallel_size: an instance of {iep} NPUs must fill whole nodes of "
            f"{npus_per_node}"
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
    return p


def _tp_in_node(cfg: Config, npus_per_node: int) -> list[str]:
    """A TP group must stay inside one node (HCCS); across nodes its all-reduces would crawl."""
    p: list[str] = []
    for name, k in (
        ("actor_config.tensor_model_parallel_size", cfg.actor_config.tensor_model_parallel_size),
        ("generate_config.infer_tensor_parallel_size", cfg.generate_config.infer_tensor_parallel_size),
    ):
        if k > npus_per_node or npus_per_node % k:
            p.append(
                f"{name}: TP{k} must divide the {npus_per_node} NPUs of a node (a TP group stays in one "
                f"node, on HCCS)"
            )
    return p


def _length_problems(cfg: Config, arch: ModelDims) -> list[str]:
    """Prompt + response must fit vLLM's max_model_len and the model's positions, else requests fail."""
    gen = cfg.generate_config
    p: list[str] = []
    s = seq_len(cfg)
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
    return p


def _batches(cfg: Config, lay: Deployment) -> None:
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


def _critic_memory(cfg: Config, arch: ModelDims, lay: Deployment, trainer: list[MemoryEstimate]) -> None:
    """PPO's critic, colocated with the trainer ranks: its rows, its ranks fit on the trainer's NPUs, and
    one trainer NPU holds its trainer stage and a critic stage (one runtime reserve)."""
    critic = critic_memory(cfg, arch, lay.card)
    if not critic:
        return
    lay.memory.extend(critic)
    cr, act = cfg.critic_config, cfg.actor_config
    c_world = cr.tensor_model_parallel_size * cr.pipeline_model_parallel_size * critic_dp(cfg)
    t_world = (act.tensor_model_parallel_size * act.pipeline_model_parallel_size * act.data_parallel_size
               * act.context_parallel_size)
    if c_world > t_world:
        lay.problems.append(f"critic_config: TP x PP x DP = {c_world} critic ranks, more than the {t_world} "
                            "trainer ranks it is colocated with; lower critic_config.data_parallel_size "
                            "(0: fill the trainer's ranks)")
    both = max(t.total_gib for t in trainer) + max(c.total_gib - c.parts["runtime"] for c in critic)
    if both > lay.card.memory_gib:
        lay.problems.append(f"memory: a trainer NPU holds its trainer stage and a critic stage, ~{both:.1f} "
                            f"GiB > {lay.card.memory_gib:.0f} GiB per {lay.card.name}; raise critic_config "
                            "TP/PP, "
                            "or set critic_config.use_distributed_optimizer with data_parallel_size > 1")
    lay.warnings.append(f"PPO critic colocated with the trainer ranks: ~{both:.1f} GiB per trainer NPU with "
                        "both (the pipeline starts the critic on CPU only so far)")


def _memory(cfg: Config, arch: ModelDims, lay: Deployment) -> None:
    gen = cfg.generate_config
    if not 0 < gen.gpu_memory_utilization <= 1:
        lay.problems.append(
            f"generate_config.gpu_memory_utilization: {gen.gpu_memory_utilization} is not in (0, 1]"
        )
        return
    trainer = trainer_memory(cfg, arch, lay.card)
    resident = max(trainer_resident_gib(cfg, t) for t in trainer) if lay.colocated else None
    inst = instance_memory(cfg, arch, lay.card, resident)
    lay.memory.append(inst)
    where = f"infer TP{gen.infer_tensor_parallel_size}" + (
        f" x EP{gen.infer_expert_parallel_size}" if gen.infer_expert_parallel_size > 1 else ""
    )
    card_gib = lay.card.memory_gib
    if resident is not None and resident + gen.gpu_memory_utilization * card_gib > card_gib:
        lay.problems.append(
            f"memory: in the rollout phase the trainer keeps {resident:.1f} GiB per NPU (what "
            f"offload_train_param/grad/optimizer leave on the NPU) beside the engine's "
            f"gpu_memory_utilization {gen.gpu_memory_utilization} x {card_gib:.0f} GiB > {card_gib:.0f} GiB; "
            "turn on offload_train_* or lower gpu_memory_utilization"
        )
    elif inst.kv_tokens < seq_len(cfg):
        lay.problems.append(
            f"memory: a rollout instance ({where}) needs weights "
            f"{inst.parts['weights']:.1f} + workspace {inst.parts['workspace']:.1f} + runtime "
            f"{RUNTIME_RESERVE_GIB:.0f} GiB per NPU and leaves KV cache for {inst.kv_tokens:,} tokens, "
            f"less than one sequence of {seq_len(cfg)}, within gpu_memory_utilization "
            f"{gen.gpu_memory_utilization} x {lay.card.memory_gib:.0f} GiB; raise infer_tensor_parallel_size "
            "or gpu_memory_utilization"
        )
    elif inst.kv_tokens < gen.max_num_seqs * seq_len(cfg) // 4:
        lay.warnings.append(
            f"rollout KV cache holds {inst.kv_tokens:,} tokens: max_num_seqs {gen.max_num_seqs} will "
            f"be limited by KV space once responses grow"
        )
    for est in trainer:
        lay.memory.append(est)
        if est.total_gib > est.budget_gib:
            lay.problems.append(
                f"memory: {est.role} needs ~{est.total_gib:.1f} GiB per NPU ("
                + ", ".join(f"{k} {v:.1f}" for k, v in est.parts.items() if v)
                + f") > {est.budget_gib:.0f} GiB per {lay.card.name}; raise TP/PP/EP, set "
                "use_distributed_optimizer with DP > 1, recompute_granularity=full, or a smaller "
                "micro_batch_size"
            )
    _critic_memory(cfg, arch, lay, trainer)
    if lay.colocated:
        inst.notes.append(
            "trainer phase: the engines sleep (vLLM sleep mode level 1: weights to host, KV cache freed), "
            "so each trainer row above has the NPU to itself"
        )
    _host_memory(cfg, lay, trainer, inst)
    if not lay.colocated and gen.gpu_memory_utilization < 0.7:
        lay.warnings.append(
            f"generate_config.gpu_memory_utilization {gen.gpu_memory_utilization}: rollout NPUs are not"
            " shared with training in this mode; 0.85-0.9 gives the KV cache the rest"
        )


def host_budget_gib(cfg: Config, card: Card) -> tuple[float, float]:
    """(host memory per node, what is left of it for the job's state) in GiB; (0, 0) = unknown."""
    total = cfg.trainer.host_memory_gib or card.host_memory_gib
    if total <= 0:
        return 0.0, 0.0
    ray = min(RAY_OBJECT_STORE_FRACTION * total, RAY_OBJECT_STORE_MAX_GIB)
    return total, total - ray - HOST_OS_RESERVE_GIB


def _host_memory(cfg: Config, lay: Deployment, trainer: list[MemoryEstimate], inst: MemoryEstimate) -> None:
    """Host bytes of the fullest node: every trainer rank's offloaded optimizer state and pinned gradients
    (the largest stage's, an upper bound), and in a colocated mode what offload_train_* move there while
    the engines generate, or the sleeping engine's weights while the trainer runs (the larger)."""
    total, budget = host_budget_gib(cfg, lay.card)
    per_rank = max(t.host_gib for t in trainer)
    if lay.colocated:
        moved = max(sum(t.parts.values()) - t.parts["runtime"] - t.parts["activations"] - t.parts["logits"]
                    - trainer_resident_gib(cfg, t) for t in trainer)
        per_rank += max(moved, inst.parts["weights"])  # rollout phase | trainer phase
    ranks: dict[int, int] = {}
    for g in lay.trainer:
        ranks[g.node] = ranks.get(g.node, 0) + len(g.npus)
    lay.host_gib_per_node = per_rank * max(ranks.values(), default=0)
    lay.host_budget_gib = budget
    if budget and lay.host_gib_per_node > budget:
        lay.problems.append(
            f"host memory: a node holds ~{lay.host_gib_per_node:.0f} GiB of the trainer's state ("
            f"{max(ranks.values())} ranks x {per_rank:.1f} GiB: optimizer state offloaded at "
            f"{cfg.actor_config.optimizer_offload_fraction:g}, pinned gradients"
            + (", offload_train_* and sleeping engine weights" if lay.colocated else "")
            + f") > {budget:.0f} GiB left of trainer.host_memory_gib {total:.0f} (Ray object store, OS); "
            "lower actor_config.optimizer_offload_fraction or use more nodes"
        )


def place(cfg: Config, nodes: int, npus_per_node: int, card: Card | None = None) -> Deployment:
    """Only the placement: which node and devices each rollout instance and trainer TP group gets
    (`problems` says what does not fit). `plan_layout` adds the model and memory checks; the fleet
    binds its Ray placement groups to this (`ray_groups`)."""
    gen, act = cfg.generate_config, cfg.actor_config
    card = card or Card("any", 0.0, npus_per_node, "")
    colocated = cfg.rl_config.mode in COLOCATED_MODES
    per_instance = instance_npus(cfg)
    instances = gen.num_instances
    if colocated:  # every NPU generates, as MindSpeed-RL's integrated worker (asp_npu.pipeline.modes)
        instances = max(instances, nodes * npus_per_node // per_instance)
    rollout = instances * per_instance
    trainer = trainer_world(cfg)
    lay = Deployment(nodes, npus_per_node, card, cfg.rl_config.mode, colocated, rollout, trainer)
    if npus_per_node > card.npus_per_node:
        lay.problems.append(
            f"cluster: {npus_per_node} NPUs per node, but a {card.name} node has {card.npus_per_node}"
        )
    need = max(rollout, trainer) if colocated else rollout + trainer
    if need > lay.total_npus:
        what = "max" if colocated else "sum"
        lay.problems.append(
            f"cluster: the config needs {need} NPUs ({what} of rollout {instances} instances x "
            f"{per_instance} NPUs = {rollout} and trainer "
            f"TP{act.tensor_model_parallel_size} x PP{act.pipeline_model_parallel_size} x "
            f"CP{act.context_parallel_size} x DP{act.data_parallel_size} = {trainer}) but {nodes} node(s) x "
            f"{npus_per_node} NPUs = {lay.total_npus}"
        )
    else:
        _place(cfg, lay, colocated)
    if colocated and rollout != trainer:
        lay.warnings.append(
            f"{lay.mode}: rollout uses {rollout} NPUs and training {trainer}; the rest idle in one phase"
        )
    return lay


def plan_layout(cfg: Config, nodes: int, npus_per_node: int, card: Card) -> Deployment:
    """Place instances and trainer ranks on `nodes` x `npus_per_node` NPUs and list every problem."""
    lay = place(cfg, nodes, npus_per_node, card)
    arch, problems, source = resolve_arch(cfg)
    lay.arch, lay.arch_source = arch, source
    lay.problems += problems
    _batches(cfg, lay)
    if arch is not None and not problems:
        if arch.model_type in TRAINER_CANNOT_BUILD:
            lay.problems.append(f"model: {TRAINER_CANNOT_BUILD[arch.model_type]} (memory sized below)")
        _divisibility(cfg, arch, lay)
        _memory(cfg, arch, lay)
    if lay.idle and not lay.problems:
        lay.warnings.append(
            f"{len(lay.idle)} NPU(s) unused: "
            + ", ".join(f"node {n} NPU {d}" for n, d in lay.idle[:8])
            + (" ..." if len(lay.idle) > 8 else "")
        )
    return lay


# ---------------------------------------------------------------- Ray placement groups


@dataclass(frozen=True)
class BundleGroup:
    """One Ray placement group of the layout: a rollout instance (its devices, STRICT_PACK on one node,
    as MindSpeed-RL and verl pack an engine's workers) or one trainer TP group (STRICT_PACK: a TP group
    stays in one node). An expert-parallel instance over whole nodes is PACKed and bound to no node."""

    name: str
    node: int  # the layout's node index the group is bound to; -1: any node
    bundles: tuple[dict[str, float], ...]  # one per device: {"CPU": 1} (+ {"NPU": 1} on NPU)
    strategy: str = "STRICT_PACK"


def ray_groups(lay: Deployment, resource: str | None) -> tuple[list[BundleGroup], list[BundleGroup]]:
    """The placement groups of `lay`: one per rollout instance, one per trainer TP group (rank order).
    `resource`: the Ray resource of a device ("NPU", "GPU"); None on CPU, where a device is a core."""

    def bundle() -> dict[str, float]:
        return {"CPU": 1.0} if resource is None else {"CPU": 1.0, resource: 1.0}

    instances = [
        BundleGroup(f"instance-{p.instance}", p.node if p.span_nodes == 1 else -1,
                    tuple(bundle() for _ in range(len(p.npus) * p.span_nodes)),
                    "STRICT_PACK" if p.span_nodes == 1 else "PACK")
        for p in lay.instances
    ]
    trainer = [BundleGroup(f"trainer-tp{g}", t.node, tuple(bundle() for _ in t.ranks))
               for g, t in enumerate(lay.trainer)]
    return instances, trainer
