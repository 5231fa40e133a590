"""Dataclass configuration with defaults that work; YAML files and `key=value` only override.

Section and key names follow MindSpeed-RL / verl where the concept is the same
(`actor_config.tensor_model_parallel_size`, `rl_config.n_samples_per_prompt`,
`generate_config.max_num_seqs`, ...). Every value is validated here, before any actor, engine or
process group starts; `validate` lists every problem, not just the first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from asp_npu.core.modes import COLOCATED_MODES, MODES  # the one mode table
from asp_npu.errors import ConfigError, UserError


@dataclass
class ModelArch:
    """Architecture numbers for `asp-npu check` memory/TP estimates; 0 = read model.path/config.json."""

    hidden_size: int = 0
    num_layers: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    vocab_size: int = 0
    intermediate_size: int = 0
    max_position_embeddings: int = 0
    tie_word_embeddings: bool = False
    model_type: str = ""  # HF model_type: qwen2 | qwen3 | qwen3_moe | llama | deepseek_v3 ("" = config.json)
    head_dim: int = 0  # per-head channels (Megatron kv_channels); 0 = hidden_size / num_attention_heads
    num_experts: int = 0  # MoE: routed experts per MoE layer (0 = dense)
    moe_router_topk: int = 0  # MoE: experts per token
    moe_ffn_hidden_size: int = 0  # MoE: one expert's FFN width
    moe_shared_expert_intermediate_size: int = 0  # MoE: shared experts' FFN width (DeepSeek)
    first_k_dense_replace: int = 0  # MoE: leading dense layers (DeepSeek)
    q_lora_rank: int = 0  # MLA (DeepSeek-V3): query low-rank dim (0 = full-rank query)
    kv_lora_rank: int = 0  # MLA: compressed KV dim (> 0 = multi-latent attention)
    qk_head_dim: int = 0  # MLA: per-head q/k dim without RoPE (qk_nope_head_dim)
    qk_pos_emb_head_dim: int = 0  # MLA: per-head RoPE dim (qk_rope_head_dim)
    v_head_dim: int = 0  # MLA: per-head value dim
    qk_layernorm: bool = False  # Qwen3: RMSNorm on q and k (read from config.json when it exists)
    multi_latent_attention: bool = False  # DeepSeek-V3 MLA: refused (asp_npu.trainer.arch.MLA_MISSING)
    # MoE training settings the trainer applies (megatron TransformerConfig fields of the same names)
    moe_aux_loss_coeff: float = 0.0  # 0 = the HF config's router_aux_loss_coef (Qwen3-MoE: 0.001)
    moe_router_load_balancing_type: str = ""  # aux_loss | seq_aux_loss | none ("" = aux_loss)


@dataclass
class ModelConfig:
    """Which policy: a local HF folder, or one built by `asp-npu init-model` when absent."""

    path: str = "models/tiny"  # HF folder (config.json + tokenizer + weights)
    build_if_missing: bool = True  # run init-model when `path` does not exist (CPU demo)
    size: str = "tiny"  # init-model size when building: tiny | small
    architecture: str = "qwen2"  # init-model family when building: qwen2 | qwen3 | qwen3-moe | llama
    #                              (an existing folder's config.json decides otherwise)
    dtype: str = "float32"  # float32 | bfloat16
    warm_start_steps: int = 0  # `asp-npu train`: supervised warm-start steps before RL (0 = none)
    arch: ModelArch = field(default_factory=ModelArch)


@dataclass
class DataConfig:
    """Prompts: a verl/MindSpeed-RL style JSONL/Parquet file, or a built-in synthetic task."""

    data_path: str = ""  # empty -> synthetic task below
    task: str = "count"  # synthetic task name (asp_npu.data.tasks)
    length_dist: str = ""  # synthetic answer items, e.g. "lognormal:median=6,sigma=1.4" ("" = task default)
    num_prompts: int = 256
    seed: int = 1234


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    logprobs: int = 0


WEIGHT_TRANSFERS = ("auto", "object-store")


@dataclass
class GenerateConfig:
    """Rollout instances (MindSpeed-RL `generate_config`)."""

    num_instances: int = 2
    infer_tensor_parallel_size: int = 1
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    kv_cache_gib: float = 1.0  # VLLM_CPU_KVCACHE_SPACE on CPU
    gpu_memory_utilization: float = 0.8  # NPU/CUDA
    enforce_eager: bool = True
    max_model_len: int = 0  # prompt + response tokens per sequence; 0 = max_prompt_length + max_tokens
    infer_expert_parallel_size: int = 1  # MoE on NPU: an instance shards experts over this many NPUs
    #                                      (vLLM enable_expert_parallel: TP x DP ranks; 1 = experts TP-split)
    weight_nz_mode: int = 0  # vllm-ascend FRACTAL_NZ weight layout; RL needs 0 (NZ breaks weight reloads)
    # weight_refresh path: auto = vLLM's weight-transfer engine (gloo on CPU, nccl/HCCL on NPU; a replaced
    # rollout instance re-forms the group) | object-store (safetensors bytes, no process group: the fallback)
    weight_transfer: str = "auto"
    admission: str = "continuous"  # pipeline: a unit starts when its samples fit in free slots | "unit"
    sampling_config: SamplingConfig = field(default_factory=SamplingConfig)


@dataclass
class ActorConfig:
    """Megatron-core trainer (MindSpeed-RL `actor_config`)."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    data_parallel_size: int = 1
    expert_model_parallel_size: int = 1  # MoE: experts split over this many ranks (out of TP x CP x DP)
    expert_tensor_parallel_size: int = 0  # MoE: each expert split over this many ranks (0 = TP; MindSpeed's
    #                                        moe_tp_extend_ep = 1 with experts over TP x EP)
    context_parallel_size: int = 1  # split each sequence over this many ranks (megatron's 2 x CP chunks)
    num_layer_list: list[int] = field(default_factory=list)  # decoder layers per pipeline stage when
    #                                        uneven (MindSpeed num_layer_list; [] = num_layers / PP each)
    micro_batch_size: int = 8
    lr: float = 1e-5
    weight_decay: float = 0.0
    clip_grad: float = 1.0
    seed: int = 1234
    load: str = ""  # checkpoint folder to resume from
    save: str = ""  # checkpoint folder (defaults to <run_dir>/checkpoints)
    ppo_epochs: int = 1  # optimizer updates per TrainBatch (proximal policy = weights before the first)
    use_dynamic_bsz: bool = False  # micro-batches by padded-token budget instead of micro_batch_size (verl)
    ppo_max_token_len_per_gpu: int = 4096  # that budget, per micro-batch and rank
    num_threads: int = 0  # torch threads per trainer rank (0 = cores / ranks)
    cpu_cores: str = ""  # CPU: cores the trainer ranks are pinned to, e.g. "1" or "2,3" ("" = not pinned;
    #                      the pipeline fills it from its placement)
    use_distributed_optimizer: bool = False  # shard optimizer state (and fp32 master weights) over DP
    sequence_parallel: bool = False  # split norms/dropout activations over TP ranks (needs TP > 1)
    recompute_granularity: str = ""  # "" | selective | full (activation recomputation)
    recompute_method: str = ""  # full recompute: uniform | block ("" = uniform)
    recompute_num_layers: int = 1  # full: layers per recompute chunk (uniform) or recomputed layers (block)
    # colocated modes: move these to host memory while the engines generate, back before the update
    offload_train_optimizer: bool = False
    offload_train_grad: bool = False
    offload_train_param: bool = False

    def pinned_cores(self) -> list[int]:
        """`cpu_cores` as core ids ([] = not pinned)."""
        return [int(c) for c in self.cpu_cores.split(",")] if self.cpu_cores else []


@dataclass
class RLConfig:
    """The RL loop (MindSpeed-RL `rl_config` + the asynchronous lag control)."""

    mode: str = "asp"  # one of MODES
    adv_estimator: str = "group_norm"
    n_samples_per_prompt: int = 8  # GRPO group size
    mini_batch_size: int = 32  # samples per trainer step (whole groups)
    max_lag: int = 1  # policy lag bound in versions (0 = synchronous); AReaL max_head_offpolicyness
    weight_refresh_interval: int = 1  # refresh rollout weights every k trainer steps
    weight_refresh_mode: str = "inflight"  # inflight: load between engine steps | drain
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28  # DAPO clip-higher
    kl_coef: float = 0.0
    kl_penalty: str = "low_var_kl"
    importance_cap: float = 2.0  # truncated importance sampling of behaviour vs proximal policy
    drop_equal_reward_groups: bool = False  # DAPO dynamic sampling
    predictor: str = "history"  # history | prompt-len | oracle
    max_prompt_length: int = 512  # longest prompt in tokens (MindSpeed-RL rl_config.max_prompt_length)
    global_batch_size: int = 0  # prompts per iteration (MindSpeed-RL megatron_training); 0 = one minibatch
    plan_cost_a: float = 0.0535  # planner cost model: seconds per decode step (see asp_npu.schedule.cost)
    plan_cost_b: float = 0.00035  # planner cost model: seconds per running sequence per step
    # --- partial rollout (issue 17; see partial_rollout_problems) ---
    partial_rollout: bool = False  # lag counted from a group's newest weights (docs/architecture.md)
    max_token_lag: int | None = None  # bound on every token's lag under partial rollout (None: 4 x max_lag)
    # failures (asp_npu.core.recovery): an instance with work that delivers nothing this long is hung
    # (restarted, its groups re-dispatched); a failed request is generated again at most this often
    instance_timeout_s: float = 600.0
    max_request_retries: int = 2


@dataclass
class TrainerConfig:
    """Run bookkeeping (verl `trainer` section)."""

    train_iters: int = 10
    run_dir: str = "runs/latest"
    save_freq: int = 10  # checkpoint (trainer + pipeline state: an exact resume) every this many trainer
    # steps; 0 = only at the end; < 0 = never (a SIGTERM/SIGINT still checkpoints)
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    device: str = "auto"  # auto | cpu | npu | cuda
    nnodes: int = 1
    ray_address: str = ""  # join this running Ray cluster ("auto" | "host:port"); "" = RAY_ADDRESS, else a
    # private single-machine Ray
    n_devices_per_node: int = 0  # 0 = detect
    card: str = ""  # accelerator model for `asp-npu check`: 910b | 910b4 | a2 | a3 ("" = 910b)
    stall_timeout_s: float = 300.0  # pipeline: fail with a clear error after this long without progress
    # a trainer rank that dies or hangs stops the run cleanly; it is then started again from the last
    # complete checkpoint this many times (1: a transient loss -- a killed process, a lost node -- costs
    # the steps since the checkpoint; a fault that repeats stops the run after one more try)
    max_restarts: int = 1


@dataclass
class SFTConfig:
    """Supervised warm-start (`asp-npu sft`; `model.warm_start_steps` in `asp-npu train`) on data.task."""

    steps: int = 2500
    batch_size: int = 32  # examples per optimizer step
    lr: float = 2e-3  # peak: linear warm-up over 5% of the steps, cosine decay to 10%
    num_examples: int = 4096  # generated task examples (seed below, distinct from the RL prompts)
    max_items: int = 16  # cap on answer items of the training examples (keeps CPU steps short)
    eval_prompts: int = 64  # first N RL prompts (data section) scored greedily by exact match
    eval_every: int = 500  # steps between evaluations (0 = only before and after)
    out: str = "models/tiny-sft"  # HF folder written at the end (config + tokenizer + weights)
    seed: int = 4321


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    generate_config: GenerateConfig = field(default_factory=GenerateConfig)
    actor_config: ActorConfig = field(default_factory=ActorConfig)
    rl_config: RLConfig = field(default_factory=RLConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)


# ------------------------------------------------------------------ partial rollout (rl_config keys)
def partial_rollout_problems(rl: RLConfig) -> list[str]:
    """`max_token_lag` >= `max_lag`; partial rollout only in an asynchronous disaggregated mode (a
    synchronous one has no refresh while sequences decode)."""
    from asp_npu.core.modes import TABLE

    out = []
    tl = rl.max_token_lag
    if tl is not None and (isinstance(tl, bool) or not isinstance(tl, int)):
        out.append(f"rl_config.max_token_lag: must be an integer (got {tl!r})")
    elif tl is not None and tl < rl.max_lag:
        out.append(f"rl_config.max_token_lag: must be >= rl_config.max_lag={rl.max_lag} (got {tl})")
    if not isinstance(rl.partial_rollout, bool):
        out.append(f"rl_config.partial_rollout: must be true|false (got {rl.partial_rollout!r})")
    elif rl.partial_rollout:
        mode = TABLE.get(rl.mode)
        if mode is not None and (mode.colocated or mode.fixed_lag == 0 or rl.max_lag == 0):
            out.append(f"rl_config.partial_rollout: mode '{rl.mode}' is synchronous or colocated; "
                       "partial rollout needs an asynchronous disaggregated mode")
        elif rl.weight_refresh_mode == "drain":
            out.append("rl_config.partial_rollout: needs rl_config.weight_refresh_mode=inflight "
                       "(a drained refresh lets every sequence finish on the old weights)")
    return out


# Allowed range of each numeric field: "section.key" -> (low, high, low_exclusive, high_exclusive); None =
# unbounded. A numeric field not listed here must be finite and >= 0 (`range_problems`), so a key added
# to a dataclass above is range-checked without an entry; list it only when its range differs.
Range = tuple[float | None, float | None, bool, bool]
AT_LEAST_1: Range = (1, None, False, False)
POSITIVE: Range = (0, None, True, False)
FRACTION: Range = (0, 1, True, False)  # (0, 1]
NUMERIC_RANGES: dict[str, Range] = {
    "data.num_prompts": (0, None, False, False),  # 0 = every prompt of data.data_path (synthetic: >= 1)
    "generate_config.num_instances": AT_LEAST_1,
    "generate_config.infer_tensor_parallel_size": AT_LEAST_1,
    "generate_config.infer_expert_parallel_size": AT_LEAST_1,
    "generate_config.max_num_seqs": AT_LEAST_1,
    "generate_config.max_num_batched_tokens": AT_LEAST_1,
    "generate_config.kv_cache_gib": POSITIVE,
    "generate_config.gpu_memory_utilization": FRACTION,
    "generate_config.sampling_config.top_p": FRACTION,
    "generate_config.sampling_config.max_tokens": AT_LEAST_1,
    "actor_config.tensor_model_parallel_size": AT_LEAST_1,
    "actor_config.pipeline_model_parallel_size": AT_LEAST_1,
    "actor_config.data_parallel_size": AT_LEAST_1,
    "actor_config.expert_model_parallel_size": AT_LEAST_1,
    "actor_config.context_parallel_size": AT_LEAST_1,
    "actor_config.micro_batch_size": AT_LEAST_1,
    "actor_config.ppo_epochs": AT_LEAST_1,
    "actor_config.ppo_max_token_len_per_gpu": AT_LEAST_1,
    "rl_config.n_samples_per_prompt": AT_LEAST_1,
    "rl_config.mini_batch_size": AT_LEAST_1,
    "rl_config.weight_refresh_interval": AT_LEAST_1,
    "rl_config.clip_ratio_low": (0, 1, False, False),
    "rl_config.importance_cap": POSITIVE,
    "rl_config.max_prompt_length": AT_LEAST_1,
    "rl_config.plan_cost_a": POSITIVE,
    "trainer.train_iters": AT_LEAST_1,
    "trainer.nnodes": AT_LEAST_1,
    "trainer.stall_timeout_s": POSITIVE,
    "rl_config.instance_timeout_s": POSITIVE,  # max_request_retries: the default range (>= 0)
    "sft.batch_size": AT_LEAST_1,
    "sft.num_examples": AT_LEAST_1,
    "sft.max_items": AT_LEAST_1,
}
DEFAULT_RANGE: Range = (0, None, False, False)
# Allowed values of the string fields the code branches on (the rest: see validate below).
LOGGERS = ("console", "jsonl", "tensorboard")  # asp_npu.observe.metrics.MetricsLogger sinks
ADV_ESTIMATORS = ("group_norm",)
KL_PENALTIES = ("low_var_kl", "kl", "mse")  # asp_npu.trainer.losses.KL_PENALTIES
MODEL_SIZES = ("tiny", "small")  # asp_npu.data.init_model.SIZES


def _range_text(r: Range) -> str:
    low, high, low_x, high_x = r
    if high is None:
        return f"{'>' if low_x else '>='} {low:g}"
    return f"in {'(' if low_x else '['}{low:g}, {high:g}{')' if high_x else ']'}"


def _in_range(value: float, r: Range) -> bool:
    low, high, low_x, high_x = r
    if low is not None and (value <= low if low_x else value < low):
        return False
    return high is None or (value < high if high_x else value <= high)


def range_problems(obj: Any, prefix: str = "") -> list[str]:
    """Every int/float field of the config tree: finite (no NaN, no inf) and in its NUMERIC_RANGES range."""
    problems: list[str] = []
    for f in fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            problems += range_problems(value, key + ".")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            r = NUMERIC_RANGES.get(key, DEFAULT_RANGE)
            if not math.isfinite(value):
                problems.append(f"{key}: must be a finite number {_range_text(r)} (got {value})")
            elif not _in_range(value, r):
                problems.append(f"{key}: must be {_range_text(r)} (got {value})")
    return problems


def _choice_problems(cfg: Config) -> list[str]:
    """String fields with a fixed set of values."""
    problems: list[str] = []
    unknown = [lg for lg in cfg.trainer.logger if lg not in LOGGERS]
    if unknown:
        problems.append(f"trainer.logger: '{unknown[0]}' is not one of {', '.join(LOGGERS)}")
    for key, value, allowed in (("rl_config.adv_estimator", cfg.rl_config.adv_estimator, ADV_ESTIMATORS),
                                ("rl_config.kl_penalty", cfg.rl_config.kl_penalty, KL_PENALTIES),
                                ("model.size", cfg.model.size, MODEL_SIZES)):
        if value not in allowed:
            problems.append(f"{key}: '{value}' is not one of {', '.join(allowed)}")
    return problems


def validate(cfg: Config) -> list[str]:
    """Return every problem found (empty list = valid). Hardware-independent checks only."""
    problems = range_problems(cfg) + _choice_problems(cfg)
    rl, gen, act = cfg.rl_config, cfg.generate_config, cfg.actor_config
    if rl.mode not in MODES:
        problems.append(f"rl_config.mode: '{rl.mode}' is not one of {', '.join(MODES)}")
    G = rl.n_samples_per_prompt
    if G >= 1 and rl.mini_batch_size >= 1 and rl.mini_batch_size % G:
        problems.append(
            f"rl_config.mini_batch_size: {rl.mini_batch_size} does not hold whole groups of "
            f"n_samples_per_prompt={rl.n_samples_per_prompt}"
        )
    if rl.weight_refresh_mode not in ("inflight", "drain"):
        problems.append(f"rl_config.weight_refresh_mode: '{rl.weight_refresh_mode}' is not inflight|drain")
    problems += partial_rollout_problems(rl)
    if not cfg.data.data_path and cfg.data.num_prompts < 1:
        problems.append(f"data.num_prompts: the synthetic task needs >= 1 prompt "
                        f"(got {cfg.data.num_prompts})")
    if cfg.data.length_dist:
        from asp_npu.data.tasks import parse_length_dist

        try:
            parse_length_dist(cfg.data.length_dist)
        except UserError as exc:
            problems.append(f"data.length_dist: {exc}")
    if act.cpu_cores and not all(c.strip().isdigit() for c in act.cpu_cores.split(",")):
        problems.append(f"actor_config.cpu_cores: '{act.cpu_cores}' is not a comma-separated list of cores")
    problems += _trainer_feature_problems(act, rl.mode)
    problems += _npu_rollout_problems(gen)
    if gen.weight_transfer not in WEIGHT_TRANSFERS:
        problems.append(f"generate_config.weight_transfer: '{gen.weight_transfer}' is not "
                        f"{'|'.join(WEIGHT_TRANSFERS)}")
    if gen.admission not in ("continuous", "unit"):
        problems.append(f"generate_config.admission: '{gen.admission}' is not continuous|unit")
    if cfg.trainer.device not in ("auto", "cpu", "npu", "cuda"):
        problems.append(f"trainer.device: '{cfg.trainer.device}' is not auto|cpu|npu|cuda")
    if cfg.model.dtype not in ("float32", "bfloat16", "float16"):
        problems.append(f"model.dtype: '{cfg.model.dtype}' is not float32|bfloat16|float16")
    if not cfg.model.build_if_missing and not Path(cfg.model.path).exists():
        problems.append(f"model.path: '{cfg.model.path}' does not exist")
    problems += _arch_problems(cfg)
    return problems


def _arch_problems(cfg: Config) -> list[str]:
    """Model family and expert parallelism: unknown families, MLA, EP not dividing experts or DP."""

    from asp_npu.trainer.arch import ARCHS, MLA_MISSING, hf_arch_problems
    from asp_npu.trainer.parallel import expert_problems, stage_problems

    m, act = cfg.model, cfg.actor_config
    problems = []
    if m.architecture not in ARCHS:
        problems.append(f"model.architecture: '{m.architecture}' is not one of {', '.join(ARCHS)}")
    if m.arch.multi_latent_attention:
        problems.append(f"model.arch.multi_latent_attention: {MLA_MISSING}")
    balancing = m.arch.moe_router_load_balancing_type
    if balancing not in ("", "aux_loss", "seq_aux_loss", "none"):
        problems.append(f"model.arch.moe_router_load_balancing_type: '{balancing}' is not "
                        "aux_loss|seq_aux_loss|none")
    experts = m.arch.num_experts
    cfg_json = Path(m.path) / "config.json"
    hf: dict[str, Any] = {}
    if cfg_json.is_file():
        from asp_npu.data.init_model import read_model_config

        try:
            hf = read_model_config(m.path)
        except UserError as exc:
            return problems + [f"model.path: {exc}"]
        problems += hf_arch_problems(hf, f"model.path {cfg_json}")
        experts = experts or int(hf.get("num_experts") or hf.get("num_local_experts")
                                 or hf.get("n_routed_experts") or 0)
    elif not Path(m.path).exists() and m.architecture == "qwen3-moe":
        from asp_npu.data.init_model import MOE_EXPERTS

        experts = experts or MOE_EXPERTS  # what init-model builds
    if experts and act.tensor_model_parallel_size > 1 and not act.sequence_parallel:
        problems.append(f"actor_config.sequence_parallel: must be true for a MoE model at "
                        f"tensor_model_parallel_size={act.tensor_model_parallel_size} (megatron-core refuses "
                        "MoE + TP without it)")
    if experts and act.context_parallel_size > 1:
        problems.append(f"actor_config.context_parallel_size: CP{act.context_parallel_size} with a MoE model "
                        "is not supported yet (its load-balancing loss is not verified over context-parallel "
                        "chunks); use context_parallel_size 1")
    layers = m.arch.num_layers or (int(hf.get("num_hidden_layers", 0)) if cfg_json.is_file() else 0)
    problems += stage_problems(layers, act.pipeline_model_parallel_size, act.num_layer_list)
    sizes = (act.tensor_model_parallel_size, act.context_parallel_size, act.data_parallel_size,
             act.expert_model_parallel_size)
    if min(sizes) >= 1 and (experts or act.expert_model_parallel_size > 1):
        etp = act.expert_tensor_parallel_size or act.tensor_model_parallel_size
        problems += expert_problems(experts, act.expert_model_parallel_size,
                                    sizes[0] * sizes[1] * sizes[2], etp, m.arch.moe_ffn_hidden_size)
    return problems


def _trainer_feature_problems(act: ActorConfig, mode: str) -> list[str]:
    """Sequence parallel, recomputation and offload settings megatron-core cannot run as given."""
    problems: list[str] = []
    if act.sequence_parallel and act.tensor_model_parallel_size < 2:
        problems.append("actor_config.sequence_parallel: needs tensor_model_parallel_size > 1 "
                        f"(got {act.tensor_model_parallel_size}); set it false")
    if act.recompute_granularity not in ("", "selective", "full"):
        problems.append(f"actor_config.recompute_granularity: '{act.recompute_granularity}' is not "
                        "selective|full (or empty)")
    if act.recompute_method not in ("", "uniform", "block"):
        problems.append(f"actor_config.recompute_method: '{act.recompute_method}' is not uniform|block")
    elif act.recompute_method and act.recompute_granularity != "full":
        problems.append("actor_config.recompute_method: only applies with recompute_granularity=full")
    if act.recompute_granularity == "full" and act.recompute_num_layers < 1:
        problems.append(f"actor_config.recompute_num_layers: must be >= 1 (got {act.recompute_num_layers})")
    offload = [k for k in ("offload_train_optimizer", "offload_train_grad", "offload_train_param")
               if getattr(act, k)]
    if offload and mode not in COLOCATED_MODES:
        problems.append(f"actor_config.{offload[0]}: offload only applies when rollout and training share "
                        f"devices (rl_config.mode {'|'.join(COLOCATED_MODES)}), not in mode '{mode}'")
    return problems


def _npu_rollout_problems(gen: GenerateConfig) -> list[str]:
    """vllm-ascend settings an RL run cannot use."""
    problems: list[str] = []
    if gen.weight_nz_mode != 0:
        problems.append(f"generate_config.weight_nz_mode: {gen.weight_nz_mode} turns on vllm-ascend's "
                        "FRACTAL_NZ weight layout, which breaks repeated weight refreshes; RL needs 0")
    iep, itp = gen.infer_expert_parallel_size, gen.infer_tensor_parallel_size
    if iep > 1 and itp >= 1 and iep % itp:
        problems.append(f"generate_config.infer_expert_parallel_size: {iep} must be 1 or a multiple of "
                        f"infer_tensor_parallel_size {itp}")
    return problems


def load_config(path: str | None = None, overrides: list[str] | None = None, check: bool = True) -> Config:
    """Defaults <- YAML file <- `a.b=c` overrides; unknown keys and wrong types are ConfigErrors naming
    the file (`file:line:column` and the parser's problem for YAML syntax) or the override at fault,
    with the nearest known key for a misspelled one."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    base = OmegaConf.structured(Config)
    if path:
        base = _merge_file(base, path)
    for item in overrides or []:
        base = _merge_override(base, item)
    try:
        cfg: Config = OmegaConf.to_object(base)  # type: ignore[assignment]
    except (OmegaConfBaseException, TypeError, ValueError) as exc:
        raise ConfigError(f"{path or 'config'}: {_key_problem(exc)}") from None
    if check:
        problems = validate(cfg)
        if problems:
            raise ConfigError("; ".join(problems))
    return cfg


def _merge_file(base: Any, path: str) -> Any:
    """`base` with the YAML file `path` merged in (size-checked before it is parsed)."""
    import yaml
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from asp_npu.io import check_yaml_file, yaml_problem

    if not Path(path).exists():
        raise ConfigError(f"{path}: config file not found")
    try:
        check_yaml_file(path, "config file")
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_problem(path, exc)) from None
    except UserError as exc:
        raise ConfigError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - OmegaConf's own refusals of odd YAML (scalars, bad keys)
        raise ConfigError(f"{path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{path}: expected a mapping of sections (model, data, ...), got a list")
    try:
        return OmegaConf.merge(base, loaded)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: {_key_problem(exc)}") from None


def _merge_override(base: Any, item: str) -> Any:
    """`base` with one `key=value` override merged in; its errors name the override, not the file."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    key, eq, _ = item.partition("=")
    if not eq or not key.strip():
        raise ConfigError(f"override '{item}' is not of the form key=value")
    try:
        return OmegaConf.merge(base, OmegaConf.from_dotlist([item]))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"override '{item}': {_key_problem(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - a value YAML cannot parse
        raise ConfigError(f"override '{item}': cannot parse the value ({str(exc).splitlines()[0]})") from None


def _key_problem(exc: Exception) -> str:
    """OmegaConf's first line, led by the key, with the nearest known key for an unknown one."""
    key = getattr(exc, "full_key", None)
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    hint = _did_you_mean(key) if key and ("not in" in msg or "Key" in msg) else ""
    return f"{key + ': ' if key else ''}{msg}{hint}"


def _did_you_mean(full_key: str) -> str:
    """` (did you mean 'trainer.run_dir'?)` for a misspelled key, from the config dataclasses."""
    import difflib
    import typing

    node: Any = Config
    parts = full_key.split(".")
    for part in parts[:-1]:
        hints = typing.get_type_hints(node) if is_dataclass(node) else {}
        node = hints.get(part)
        if node is None or not is_dataclass(node):
            return ""
    names = [f.name for f in fields(node)]
    if parts[-1] in names:
        return ""
    close = difflib.get_close_matches(parts[-1], names, n=1, cutoff=0.6)
    return f" (did you mean '{'.'.join([*parts[:-1], close[0]])}'?)" if close else ""


def to_dict(cfg: Config) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]


def config_from_mapping(raw: Any, source: str = "config") -> Config:
    """An already-parsed config (e.g. a run directory's config.yaml snapshot) -> Config over the defaults;
    unknown keys and wrong types are ConfigErrors naming `source`. Not validated (see `validate`)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(dict(raw)))
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{source}: {_key_problem(exc)}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: {str(exc).splitlines()[0]}") from None
