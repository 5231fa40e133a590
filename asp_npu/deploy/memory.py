"""Per-NPU memory of each role, by component, as megatron-core and vLLM allocate it (GiB).

Trainer (megatron-core DDP + `get_megatron_optimizer`, the numbers of megatron's distributed-optimizer
docs): bf16 weights 2 bytes/param, fp32 main gradients 4 bytes/param (megatron accumulates bf16 grads
in fp32), Adam state 12 bytes/param for 16-bit models (fp32 master copy + exp_avg + exp_avg_sq;
8 for fp32 models), divided by the data-parallel size with `use_distributed_optimizer` -- per
parameter 18 bytes plain, 6 + 12/DP distributed (DP x CP with context parallelism). Dense weights are
split over TP, routed experts over EP x expert-TP (megatron's expert_tensor_parallel_size: TP by
default, 1 for MindSpeed's moe_tp_extend_ep, whose TP x EP split is megatron's EP), and expert optimizer
state over the expert data-parallel group TP x CP x DP / (EP x expert-TP). Each pipeline stage holds
its own layers (`num_layer_list` for uneven stages); the check reports the first, the last and the
largest middle stage.

Optimizer state on the host (`actor_config.optimizer_cpu_offload`, megatron-core's HybridDeviceOptimizer;
MindSpeed's `swap_optimizer` imports to it) follows megatron's own rule tensor by tensor
(`asp_npu.deploy.hybrid`): whole tensors of the rank's shard, in the order the distributed optimizer
hands them over, go to the host until `optimizer_offload_fraction` of its elements is reached (the last
one overshoots). The host keeps 16 bytes per offloaded element (fp32 master, both Adam moments, a pinned
fp32 gradient copy); the NPU keeps the moments of the rest and, for 16-bit models, the fp32 master
shard of every element. The fp32 main gradients stay on the NPU (megatron's DDP buffer). The worst DP
rank is reported.

Activations follow Korthikanti et al. (2022) with flash attention (no s^2 score term, so selective
recomputation -- megatron-core's default `recompute_modules` [core_attn] -- stores the same bytes as none
and costs no extra compute: the search tries none and full) for a SwiGLU MLP, per layer and
micro-batch of T tokens: replicated 10h (two norm inputs, attention and MLP inputs, two dropout masks)
plus TP-split Q/K/V/attention-output and MLP (6F; MoE: top-k x (2h + 6F_expert) for the permuted
tokens + 6F_shared). Sequence parallelism divides the replicated part by TP too. Full recompute keeps
each checkpointed layer's input (2Th) and rebuilds one chunk at a time: `uniform` checkpoints every
`recompute_num_layers` layers; `block` recomputes the first `recompute_num_layers` layers of a stage
and keeps the others whole. 1F1B holds min(PP - stage, micro-batches) micro-batches on a stage.
Context parallelism gives each rank 1/CP of every micro-batch's tokens.

MindSpeed-RL's `offload_train_optimizer/grad/param` (colocated modes) move those bytes to host memory
while the engines generate: they still count while training, but leave room for the engine's
`gpu_memory_utilization` share in the rollout phase; the engine sleeps while the trainer runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from asp_npu.arch import ModelDims
from asp_npu.config import Config, critic_view
from asp_npu.deploy import hybrid

GIB = 1024**3
RUNTIME_RESERVE_GIB = 3.0  # CANN/HCCL workspaces and buffers (HCCL_BUFFSIZE per comm group), allocator slack
HOST_BYTES_PER_OFFLOADED_PARAM = hybrid.HOST_BYTES  # fp32 master + exp_avg + exp_avg_sq + pinned fp32 grad
TRAINER_PARTS = ("weights", "gradients", "optimizer", "activations", "logits", "reference", "runtime")
ROLLOUT_PARTS = ("trainer_resident", "weights", "workspace", "kv_cache", "runtime")


@dataclass(frozen=True)
class Card:
    """One accelerator model as torch_npu sees it (an A3 chip shows up as two 64 GB devices)."""

    name: str
    memory_gib: float
    npus_per_node: int
    description: str
    host_memory_gib: float = 0.0  # host DRAM per node, the typical configuration (trainer.host_memory_gib)


@dataclass
class MemoryEstimate:
    role: str  # "trainer stage k" | "rollout instance" | "rollout phase ..."
    parts: dict[str, float]  # GiB per NPU
    budget_gib: float
    kv_tokens: int = 0  # rollout: KV cache capacity in tokens per instance
    host_gib: float = 0.0  # host memory this role's rank (one NPU) holds: optimizer state offloaded to it
    notes: list[str] = field(default_factory=list)

    @property
    def total_gib(self) -> float:
        return sum(self.parts.values())


def bytes_per(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def seq_len(cfg: Config) -> int:
    return cfg.generate_config.max_model_len or (
        cfg.rl_config.max_prompt_length + cfg.generate_config.sampling_config.max_tokens
    )


def tokens_per_micro_batch(cfg: Config) -> int:
    """Padded micro-batch: micro_batch_size x sequence length; dynamic batch: the token budget (a
    sequence longer than the budget still forms a micro-batch of its own)."""
    act = cfg.actor_config
    if act.use_dynamic_bsz:
        return max(act.ppo_max_token_len_per_gpu, seq_len(cfg))
    return act.micro_batch_size * seq_len(cfg)


@dataclass(frozen=True)
class StageParams:
    """Parameters held by one trainer rank of a pipeline stage."""

    dense: float  # TP-split part (attention, dense MLP, norms, router, shared experts, embeddings)
    experts: float  # routed experts, split over EP x expert-TP
    layers: int
    moe_layers: int


def expert_tp(cfg: Config) -> int:
    """Expert tensor-parallel size: actor_config.expert_tensor_parallel_size, 0 = TP (megatron's default)."""
    act = cfg.actor_config
    return act.expert_tensor_parallel_size or act.tensor_model_parallel_size


def stage_sizes(cfg: Config, arch: ModelDims) -> list[int]:
    """Decoder layers of each pipeline stage: `num_layer_list`, else num_layers / PP (rounded up)."""
    act = cfg.actor_config
    pp = act.pipeline_model_parallel_size
    if act.num_layer_list and len(act.num_layer_list) == pp:
        return list(act.num_layer_list)
    return [math.ceil(arch.num_layers / pp)] * pp


def stage_params(cfg: Config, arch: ModelDims, stage: int) -> StageParams:
    """The exact layers of `stage` (leading dense layers of a MoE model, e.g. DeepSeek's first 3, count
    where they are), its embedding/output layer, over TP (dense) and EP x expert-TP (routed experts)."""
    act = cfg.actor_config
    tp, pp, ep = (
        act.tensor_model_parallel_size,
        act.pipeline_model_parallel_size,
        act.expert_model_parallel_size,
    )
    sizes = stage_sizes(cfg, arch)
    start, layers = sum(sizes[:stage]), sizes[stage]
    leading_dense = arch.num_layers - arch.moe_layers  # every layer of a dense model
    moe_layers = layers - max(0, min(start + layers, leading_dense) - start) if arch.moe else 0
    dense_layers = layers - moe_layers
    dense = (
        layers * (arch.attention_params + 2 * arch.hidden_size)
        + dense_layers * arch.dense_mlp_params
        + moe_layers * arch.moe_layer_dense_params
    )
    if stage == 0:
        dense += arch.embedding_params
    if stage == pp - 1:
        dense += arch.embedding_params if (pp > 1 or not arch.tie_word_embeddings) else 0
        dense += arch.hidden_size  # final norm
    experts = moe_layers * arch.num_experts * 3 * arch.hidden_size * arch.moe_ffn_hidden_size
    return StageParams(dense / tp, experts / (ep * expert_tp(cfg)), layers, moe_layers)


def layer_activation_bytes(cfg: Config, arch: ModelDims, tokens: int, moe: bool) -> float:
    """Bytes one layer keeps for backward, per micro-batch of `tokens` tokens on one TP rank."""
    act = cfg.actor_config
    tp = act.tensor_model_parallel_size
    h, a, kv, hd = arch.hidden_size, arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
    replicated = 10 * h
    if arch.mla:
        qk = arch.qk_head_dim + arch.qk_pos_emb_head_dim
        split = 2 * (2 * a * qk + 2 * a * arch.v_head_dim)
        replicated += 2 * (arch.q_lora_rank + arch.kv_lora_rank + arch.qk_pos_emb_head_dim)
    else:
        split = 2 * (2 * a * hd + 2 * kv * hd)
    if moe:
        split += arch.moe_router_topk * (2 * h + 6 * arch.moe_ffn_hidden_size)
        split += 6 * arch.moe_shared_expert_intermediate_size
    else:
        split += 6 * arch.intermediate_size
    if act.sequence_parallel and tp > 1:
        return tokens * (replicated + split) / tp
    return tokens * (replicated + split / tp)


def lora_params(cfg: Config, arch: ModelDims, sp: StageParams) -> float:
    """Adapter parameters one trainer rank of a stage holds (`asp_npu.trainer.lora`): per target layer
    A [r, in] and B [out, r], the matrix on W's split dimension divided over TP, the other replicated;
    MoE layers' experts take no adapter (0 without LoRA)."""
    act = cfg.actor_config
    r, tp, t = act.lora_r, act.tensor_model_parallel_size, set(act.lora_target_modules)
    if not r or not t:
        return 0.0
    h, q = arch.hidden_size, arch.num_attention_heads * arch.head_dim
    qkv_out = q + 2 * arch.num_key_value_heads * arch.head_dim
    per_layer = (("linear_qkv" in t) * r * (h + qkv_out / tp) + ("linear_proj" in t) * r * (q / tp + h))
    mlp = (("linear_fc1" in t) * r * (h + 2 * arch.intermediate_size / tp)
           + ("linear_fc2" in t) * r * (arch.intermediate_size / tp + h))
    return sp.layers * per_layer + (sp.layers - sp.moe_layers) * mlp


def stage_activation_bytes(cfg: Config, arch: ModelDims, sp: StageParams,
                           in_flight: int) -> tuple[float, str]:
    """Activations a stage holds at the 1F1B peak, and how they were counted."""
    act = cfg.actor_config
    tp = act.tensor_model_parallel_size
    tokens = tokens_per_micro_batch(cfg) // act.context_parallel_size  # CP: each rank holds 1/CP of it
    dense_layers = sp.layers - sp.moe_layers
    per_layer = (
        dense_layers * layer_activation_bytes(cfg, arch, tokens, False)
        + sp.moe_layers * layer_activation_bytes(cfg, arch, tokens, True)
    ) / max(1, sp.layers)
    if act.recompute_granularity != "full":
        how = "no recompute" if not act.recompute_granularity else "selective (= none under flash attention)"
        return in_flight * sp.layers * per_layer, how
    ckpt = 2 * tokens * arch.hidden_size / (tp if act.sequence_parallel and tp > 1 else 1)
    n = min(max(1, act.recompute_num_layers), sp.layers)
    if act.recompute_method == "block":
        kept = in_flight * (n * ckpt + (sp.layers - n) * per_layer) + (per_layer if n else 0)
        return kept, f"full recompute, block: {n} of {sp.layers} layers recomputed"
    chunks = math.ceil(sp.layers / n)
    return in_flight * chunks * ckpt + n * per_layer, f"full recompute, uniform chunks of {n} layers"


def trainer_memory(cfg: Config, arch: ModelDims, card: Card) -> list[MemoryEstimate]:
    """Per-NPU memory of the first and last pipeline stage, and of the largest middle stage (uneven
    stages), in GiB."""
    act = cfg.actor_config
    pp = act.pipeline_model_parallel_size
    ests = [stage_memory(cfg, arch, card, stage) for stage in range(pp)]
    if pp <= 2:
        return ests
    middle = max(ests[1:-1], key=lambda e: e.total_gib)
    return [ests[0], middle, ests[-1]]


def critic_memory(cfg: Config, arch: ModelDims, card: Card) -> list[MemoryEstimate]:
    """PPO's value model (`rl_config.adv_estimator: gae`) per NPU in its own layout (`critic_config`):
    the trainer's components of `critic_view(cfg)` (no reference model), no vocabulary logits (a
    one-output head; its vocabulary-sized output layer is still counted in the weights: conservative).
    Empty without a critic. It is colocated with the trainer ranks: a trainer NPU holds both."""
    if cfg.rl_config.adv_estimator != "gae":
        return []
    out = []
    for est in trainer_memory(critic_view(cfg), arch, card):
        est.parts["logits"] = 0.0
        est.role = est.role.replace("trainer", "critic")
        est.notes.append("value head hidden -> 1 (no vocabulary logits); on the trainer ranks' NPUs")
        out.append(est)
    return out


def stage_memory(cfg: Config, arch: ModelDims, card: Card, stage: int) -> MemoryEstimate:
    """One pipeline stage's rank. Context parallelism splits each micro-batch's tokens over CP ranks
    (activations, logits / CP) and the distributed optimizer shards over DP x CP, as megatron's does;
    routed experts' state shards over the expert data-parallel group TP x CP x DP / (EP x expert-TP)."""
    act, rl = cfg.actor_config, cfg.rl_config
    tp, pp, dp, ep, cp = (
        act.tensor_model_parallel_size,
        act.pipeline_model_parallel_size,
        act.data_parallel_size,
        act.expert_model_parallel_size,
        act.context_parallel_size,
    )
    wb = bytes_per(cfg.model.dtype)
    off = offload_fraction(cfg)
    tokens = tokens_per_micro_batch(cfg)
    per_step = rl.mini_batch_size // max(1, dp)  # samples per DP rank per optimizer step
    n_micro = (
        max(1, per_step * seq_len(cfg) // tokens)
        if act.use_dynamic_bsz
        else max(1, per_step // act.micro_batch_size)
    )
    sp = stage_params(cfg, arch, stage)
    params = sp.dense + sp.experts
    acts, how = stage_activation_bytes(cfg, arch, sp, min(pp - stage, n_micro))
    adapters = lora_params(cfg, arch, sp)
    if adapters:  # LoRA: the base is frozen (no gradient buffer, no optimizer state); adapters train
        how += (f"; LoRA r{act.lora_r}: {adapters / 1e6:.1f}M adapter params per rank train, "
                "the base is frozen")
        sp = StageParams(adapters, 0.0, sp.layers, sp.moe_layers)
    trained = sp.dense + sp.experts
    opt_gib, host_gib = optimizer_gib(cfg, arch, stage, sp, lora=bool(adapters))
    parts = {
        "weights": (params + adapters) * wb / GIB,
        "gradients": trained * 4 / GIB,
        "optimizer": opt_gib,
        "activations": acts / GIB,
        "logits": (8 * tokens * arch.vocab_size / tp / cp / GIB) if stage == pp - 1 else 0.0,
        "reference": (params * wb / GIB) if rl.kl_coef > 0 and not act.offload_train_param else 0.0,
        "runtime": RUNTIME_RESERVE_GIB,
    }
    name = "first" if stage == 0 else "last" if stage == pp - 1 else "largest middle"
    est = MemoryEstimate(f"trainer stage {stage} ({name})" if pp > 1 else "trainer", parts, card.memory_gib,
                         host_gib=host_gib)
    est.notes.append(
        f"{sp.layers} layers ({sp.moe_layers} MoE), {params / 1e9:.2f}B params per rank"
        + (f" ({sp.experts / 1e9:.2f}B expert, EP{ep} x expert TP{expert_tp(cfg)})" if sp.experts else "")
        + f"; activations: {min(pp - stage, n_micro)} micro-batch(es) of {tokens:,} tokens in flight"
        + (f" (1/{cp} per rank: context parallel)" if cp > 1 else "")
        + ", "
        + how
        + (", sequence parallel" if act.sequence_parallel and tp > 1 else "")
        + (f"; optimizer {off:.0%} on the host: {est.host_gib:.1f} GiB per rank" if off else "")
    )
    return est


def offload_fraction(cfg: Config) -> float:
    """Share of the optimizer state megatron-core's HybridDeviceOptimizer keeps on the host (0 = none)."""
    act = cfg.actor_config
    return min(1.0, max(0.0, act.optimizer_offload_fraction)) if act.optimizer_cpu_offload else 0.0


def optimizer_divisors(cfg: Config) -> tuple[int, int]:
    """Ranks the optimizer state is sharded over: (dense: DP x CP, routed experts: the expert
    data-parallel group TP x CP x DP / (EP x expert-TP)); (1, 1) without the distributed optimizer."""
    act = cfg.actor_config
    if not act.use_distributed_optimizer:
        return 1, 1
    dp_cp = act.data_parallel_size * act.context_parallel_size
    return dp_cp, max(1, act.tensor_model_parallel_size * dp_cp
                      // (act.expert_model_parallel_size * expert_tp(cfg)))


def optimizer_splits(cfg: Config, arch: ModelDims,
                     stage: int) -> tuple[list[hybrid.Split], list[hybrid.Split]]:
    """Every DP rank's device/host split of `stage`'s optimizer shard under HybridDeviceOptimizer's rule
    (dense, routed experts; all on the device without offload), from the stage's tensors."""
    act = cfg.actor_config
    pp = act.pipeline_model_parallel_size
    sizes = stage_sizes(cfg, arch)
    start = sum(sizes[:stage])
    dense, experts = hybrid.stage_tensors(
        arch, range(start, start + sizes[stage]), act.tensor_model_parallel_size,
        act.expert_model_parallel_size, expert_tp(cfg), stage == 0, stage == pp - 1, pp)
    div, expert_div = optimizer_divisors(cfg)
    off = offload_fraction(cfg)
    return hybrid.rank_splits(dense, div, off), hybrid.rank_splits(experts, expert_div, off)


def optimizer_gib(cfg: Config, arch: ModelDims, stage: int, sp: StageParams,
                  lora: bool) -> tuple[float, float]:
    """Optimizer GiB one rank of `stage` keeps on the NPU and on the host. Without offload megatron's
    bytes per parameter of the rank's shard (`sp`: the trained parameters); with it the worst DP rank
    under HybridDeviceOptimizer's tensor rule (LoRA: the fraction itself, adapters being small tensors)."""
    master = bytes_per(cfg.model.dtype) == 2  # 16-bit weights: an fp32 master copy on the device
    opt_b = hybrid.MOMENT_BYTES + (hybrid.MASTER_BYTES if master else 0)
    div, expert_div = optimizer_divisors(cfg)
    shard = sp.dense / div + sp.experts / expert_div
    off = offload_fraction(cfg)
    if not off:
        return shard * opt_b / GIB, 0.0
    if lora:
        device = shard * ((hybrid.MASTER_BYTES if master else 0) + (1 - off) * hybrid.MOMENT_BYTES)
        return device / GIB, off * shard * hybrid.HOST_BYTES / GIB
    dense, experts = optimizer_splits(cfg, arch, stage)
    device = sum(max((s.device_bytes(master) for s in part), default=0) for part in (dense, experts))
    host = sum(max((s.host_bytes() for s in part), default=0) for part in (dense, experts))
    return device / GIB, host / GIB


def offloaded_params(cfg: Config, arch: ModelDims) -> float:
    """Parameters one trainer rank updates on the host per optimizer step (the fullest stage's worst
    DP rank under HybridDeviceOptimizer's rule; LoRA: that share of the adapters)."""
    act = cfg.actor_config
    off = offload_fraction(cfg)
    if not off:
        return 0.0
    pp = act.pipeline_model_parallel_size
    if act.lora_r and act.lora_target_modules:
        div = optimizer_divisors(cfg)[0]
        return off * max(lora_params(cfg, arch, stage_params(cfg, arch, s)) for s in range(pp)) / div
    return float(max(sum(max((x.host for x in part), default=0) for part in optimizer_splits(cfg, arch, s))
                     for s in range(pp)))


def trainer_resident_gib(cfg: Config, est: MemoryEstimate) -> float:
    """What a trainer rank leaves on the NPU while a colocated engine generates (offload moves the rest)."""
    act = cfg.actor_config
    p = est.parts
    keep = 0.0 if act.offload_train_param else p["weights"] + p["reference"]
    keep += 0.0 if act.offload_train_grad else p["gradients"]
    keep += 0.0 if act.offload_train_optimizer else p["optimizer"]
    return keep


def instance_npus(cfg: Config) -> int:
    """NPUs of one rollout instance: infer TP, or the expert-parallel group (vLLM TP x DP) when larger."""
    gen = cfg.generate_config
    return max(gen.infer_tensor_parallel_size, gen.infer_expert_parallel_size)


def instance_memory(cfg: Config, arch: ModelDims, card: Card,
                    resident_gib: float | None = None) -> MemoryEstimate:
    """Per-NPU memory of one vLLM instance: dense weights / TP and routed experts / EP (/ TP without EP),
    the profile-run workspace (a full max_num_batched_tokens forward plus fp32 sampler logits for
    max_num_seqs), and whatever is left of gpu_memory_utilization * card becomes KV cache.
    `resident_gib`: a colocated trainer's bytes that stay on the NPU during generation."""
    gen = cfg.generate_config
    tp, iep = gen.infer_tensor_parallel_size, gen.infer_expert_parallel_size
    wb = bytes_per(cfg.model.dtype)
    h = arch.hidden_size
    weights = arch.dense_params * wb / tp + arch.expert_params * wb / (iep if iep > 1 else tp)
    workspace = (
        gen.max_num_batched_tokens * (4 * h + 2 * arch.active_ffn / tp) * wb
        + gen.max_num_seqs * arch.vocab_size * 4
    )
    budget = gen.gpu_memory_utilization * card.memory_gib * GIB
    kv_per_token = arch.kv_bytes_per_token(wb, tp)
    kv = max(0.0, budget - weights - workspace - RUNTIME_RESERVE_GIB * GIB)
    tokens = int(kv // kv_per_token)
    parts = {
        "weights": weights / GIB,
        "workspace": workspace / GIB,
        "kv_cache": kv / GIB,
        "runtime": RUNTIME_RESERVE_GIB,
    }
    colocated = resident_gib is not None
    if resident_gib is not None:
        parts = {"trainer_resident": resident_gib, **parts}
    role = "rollout phase (colocated)" if colocated else "rollout instance"
    est = MemoryEstimate(role, parts, card.memory_gib if colocated else budget / GIB, kv_tokens=tokens)
    est.notes.append(
        f"KV cache {tokens:,} tokens = {tokens // max(1, seq_len(cfg))} full-length sequences "
        f"(max_num_seqs {gen.max_num_seqs})"
        + ((f"; experts over EP{iep}" if iep > 1 else f"; experts over TP{tp}") if arch.moe else "")
        + (
            f"; rollout phase: the trainer keeps {resident_gib:.1f} GiB (not offloaded) beside the engine's "
            f"gpu_memory_utilization {gen.gpu_memory_utilization}"
            if colocated
            else ""
        )
    )
    return est
