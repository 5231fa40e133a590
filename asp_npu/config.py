"""Dataclass configuration with defaults that work; YAML files and `key=value` only override.

Section and key names follow MindSpeed-RL / verl where the concept is the same
(`actor_config.tensor_model_parallel_size`, `rl_config.n_samples_per_prompt`,
`generate_config.max_num_seqs`, ...). Every value is validated here, before any actor, engine or
process group starts; `validate` lists every problem, not just the first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import FrozenInstanceError, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from asp_npu.core.modes import COLOCATED_MODES, MODES  # the one mode table
from asp_npu.errors import ConfigError, UserError


class Section:
    """A config section, read-only once `freeze` has run (after validation): no role changes the run's
    config mid-run. A changed copy comes from `with_changes`; what start-up derives (placement, cores,
    the warm-started model, a restart's checkpoint) is a record beside the config, not written into it
    (`pipeline/derived.py`)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen", False):
            raise FrozenInstanceError(f"the run's config is frozen after validation: {type(self).__name__}."
                                      f"{name} cannot change (derive a copy with config.with_changes)")
        object.__setattr__(self, name, value)


@dataclass
class ModelArch(Section):
    """The model's dimensions as the config may give them (0 = read model.path/config.json), under the
    names of `asp_npu.arch.ModelDims`, which `deploy.arch.resolve_arch` fills in from them."""

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
    multi_latent_attention: bool = False  # DeepSeek-V3 MLA: refused (asp_npu.arch.MLA_MISSING)
    # MoE training settings the trainer applies (megatron TransformerConfig fields of the same names)
    moe_aux_loss_coeff: float = 0.0  # 0 = the HF config's router_aux_loss_coef (Qwen3-MoE: 0.001)
    moe_router_load_balancing_type: str = ""  # aux_loss | seq_aux_loss | none ("" = aux_loss)


@dataclass
class ModelConfig(Section):
    """Which policy: a local HF folder, or one built by `asp-npu init-model` when absent."""

    path: str = "models/tiny"  # HF folder (config.json + tokenizer + weights)
    build_if_missing: bool = True  # run init-model when `path` does not exist (CPU demo)
    size: str = "tiny"  # init-model size when building: tiny | small
    architecture: str = "qwen2"  # init-model family when building: qwen2 | qwen3 | qwen3-moe | llama
    #                              (an existing folder's config.json decides otherwise)
    dtype: str = "float32"  # float32 | bfloat16
    warm_start_steps: int = 0  # `asp-npu train`: supervised warm-start steps before RL (0 = none)
    load_megatron: str = ""  # Megatron weights as the initial policy (Megatron-LM / MindSpeed-LLM: legacy
    #                          iter_*/mp_rank_*/model_optim_rng.pt or a dist checkpoint, any TP/PP);
    #                          model.path still gives config + tokenizer. MindSpeed-RL's actor_config.load
    #                          naming such a folder lands here
    arch: ModelArch = field(default_factory=ModelArch)


@dataclass
class DataConfig(Section):
    """Prompts: a verl/MindSpeed-RL style JSONL/Parquet file, or a built-in synthetic task."""

    data_path: str = ""  # empty -> synthetic task below
    task: str = "count"  # synthetic task name (asp_npu.data.tasks)
    length_dist: str = ""  # synthetic answer items, e.g. "lognormal:median=6,sigma=1.4" ("" = task default)
    num_prompts: int = 0  # 0 = every row of data_path (synthetic task: SYNTHETIC_PROMPTS); > 0 truncates
    seed: int = 1234
    prompt_type: str = ""  # MindSpeed-RL template name (qwen_r1, qwen, ...: asp_npu.data.templates)
    chat_template: str = ""  # a Jinja chat template, or a file holding one ("" = the tokenizer's own)
    layout: str = "auto"  # auto | verl (prompt messages, reward_model.ground_truth) | mindspeed (raw keys)
    prompt_key: str = "prompt"  # verl data.prompt_key
    map_keys: dict[str, str] = field(default_factory=dict)  # MindSpeed-RL map_keys: {prompt, response,
    #                                                          query, system} -> column names
    val_files: str = ""  # verl data.val_files: held-out prompts scored every trainer.test_freq steps
    val_num_prompts: int = 0  # 0 = every val_files row (synthetic task: 32 held-out prompts)


@dataclass
class SamplingConfig(Section):
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # sample among the k most likely tokens (-1 or 0: all; vLLM SamplingParams.top_k)
    min_p: float = 0.0  # drop tokens below min_p x the most likely token's probability (0: none)
    max_tokens: int = 256
    logprobs: int = 0


WEIGHT_TRANSFERS = ("auto", "object-store")


@dataclass
class ValKwargs(Section):
    """Validation sampling (verl `actor_rollout_ref.rollout.val_kwargs`): greedy unless `do_sample`."""

    do_sample: bool = False
    temperature: float = 0.0
    top_p: float = 1.0
    n: int = 1


@dataclass
class GenerateConfig(Section):
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
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)


@dataclass
class ActorConfig(Section):
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
    # packed micro-batches (MindSpeed-RL / verl use_remove_padding): one token stream per micro-batch with
    # per-sequence boundaries instead of right padding; with use_dynamic_bsz the budget counts real tokens
    use_remove_padding: bool = False
    num_threads: int = 0  # torch threads per trainer rank (0 = cores / ranks)
    cpu_cores: str = ""  # CPU: cores the trainer ranks are pinned to, e.g. "1" or "2,3" ("" = not pinned,
    #                      or the pipeline's placement's cores: its derived.yaml)
    use_distributed_optimizer: bool = False  # shard optimizer state (and fp32 master weights) over DP
    sequence_parallel: bool = False  # split norms/dropout activations over TP ranks (needs TP > 1)
    recompute_granularity: str = ""  # "" | selective | full (activation recomputation)
    recompute_method: str = ""  # full recompute: uniform | block ("" = uniform)
    recompute_num_layers: int = 1  # full: layers per recompute chunk (uniform) or recomputed layers (block)
    # colocated modes: move these to host memory while the engines generate, back before the update
    offload_train_optimizer: bool = False
    offload_train_grad: bool = False
    offload_train_param: bool = False
    # learning-rate schedule: megatron-core's OptimizerParamScheduler, stepped once per optimizer step
    # (MindSpeed-RL actor_config names; iterations are trainer.train_iters units; docs/optimizer.md)
    lr_decay_style: str = "constant"  # constant | linear | cosine
    min_lr: float = 0.0  # lr at the end of the decay
    lr_warmup_fraction: float = 0.0  # linear warm-up over this fraction of the decay (else lr_warmup_iters)
    lr_warmup_iters: int = 0  # linear warm-up over this many iterations
    lr_warmup_init: float = 0.0  # lr at the first warm-up step
    lr_decay_iters: int = 0  # iterations from the start to min_lr (0 = trainer.train_iters)
    weight_decay_incr_style: str = "constant"  # constant (weight_decay) | linear | cosine: start -> end
    start_weight_decay: float = 0.0  # only with weight_decay_incr_style linear | cosine
    end_weight_decay: float = 0.0
    # Adam (megatron-core OptimizerConfig; AdamW: weight decay decoupled)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    # optimizer state on the host in any mode (megatron-core HybridDeviceOptimizer; MindSpeed's
    # swap_optimizer imports to it): this share of the fp32 master weights and Adam moments lives and is
    # stepped in host memory; needs use_distributed_optimizer
    optimizer_cpu_offload: bool = False
    optimizer_offload_fraction: float = 1.0
    # LoRA (MindSpeed-RL names; verl's lora_rank / target_modules import to them): the base weights are
    # frozen, adapters on these megatron layers are trained and checkpointed, refreshes send W + alpha/r BA
    lora_r: int = 0  # adapter rank (0 = no LoRA: every weight trains)
    lora_alpha: float = 16.0  # the adapter's output is scaled by lora_alpha / lora_r
    lora_target_modules: list[str] = field(default_factory=list)  # of LORA_TARGETS

    def pinned_cores(self) -> list[int]:
        """`cpu_cores` as core ids ([] = not pinned)."""
        return [int(c) for c in self.cpu_cores.split(",")] if self.cpu_cores else []


@dataclass
class CriticConfig(Section):
    """The value model of PPO with a critic (`rl_config.adv_estimator: gae`; MindSpeed-RL `critic_config`,
    verl `critic`): the policy's architecture with a scalar head, initialised from model.path, with its own
    megatron layout and optimizer (asp_npu/trainer/critic.py). On CPU its ranks share the trainer's cores."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    data_parallel_size: int = 0  # 0 = fill the trainer's ranks: trainer world / (TP x PP)
    micro_batch_size: int = 8
    ppo_epochs: int = 1  # critic updates per TrainBatch (verl critic.ppo_epochs)
    lr: float = 1e-5
    min_lr: float = 0.0
    lr_decay_style: str = "constant"  # constant | linear | cosine
    lr_warmup_fraction: float = 0.0
    weight_decay: float = 0.0
    clip_grad: float = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    use_distributed_optimizer: bool = False
    sequence_parallel: bool = False  # needs TP > 1
    seed: int = 1234


@dataclass
class RLConfig(Section):
    """The RL loop (MindSpeed-RL `rl_config` + the asynchronous lag control)."""

    mode: str = "asp"  # one of MODES
    # group_norm (GRPO), gae (PPO with a critic: critic_config) or a critic-free estimator (docs/loss.md)
    adv_estimator: str = "group_norm"
    gamma: float = 1.0  # discount: gae and reinforce_plus_plus (MindSpeed-RL / verl gamma)
    lam: float = 0.95  # gae: lambda (MindSpeed-RL / verl rl_config.lam)
    cliprange_value: float = 0.5  # gae: value clipping around the scoring values (0 = off; verl critic)
    n_samples_per_prompt: int = 8  # GRPO group size
    mini_batch_size: int = 32  # samples per trainer step (whole groups)
    max_lag: int = 1  # policy lag bound in versions (0 = synchronous); AReaL max_head_offpolicyness
    weight_refresh_interval: int = 1  # refresh rollout weights every k trainer steps
    weight_refresh_mode: str = "inflight"  # inflight: load between engine steps | drain
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28  # DAPO clip-higher
    kl_coef: float = 0.0  # KL coefficient (initial value under kl_ctrl_type adaptive); 0 = no reference model
    kl_penalty: str = "low_var_kl"  # KL estimator: low_var_kl (k3) | kl (k1) | mse (k2) | abs (verl's names)
    importance_cap: float = 2.0  # truncated importance sampling of behaviour vs proximal policy (0 = off)
    # --- the loss (docs/loss.md; verl / MindSpeed-RL names) ---
    clip_ratio_c: float = 3.0  # dual-clip bound on the loss of A < 0 tokens (verl's default); 0 = off
    loss_agg_mode: str = "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean |
    #                                    seq-mean-token-sum-norm (verl's agg_loss over the whole minibatch)
    loss_scale_factor: int = 0  # seq-mean-token-sum-norm's divisor (0 = sampling_config.max_tokens)
    norm_adv_by_std_in_grpo: bool = True  # false: Dr.GRPO advantages r - mean (no std division)
    entropy_coeff: float = 0.0  # loss -= entropy_coeff x entropy (vocabulary-parallel over TP)
    use_kl_in_reward: bool = False  # the KL penalty in the reward before advantages instead of in the loss
    kl_ctrl_type: str = "fixed"  # fixed | adaptive (verl kl_ctrl.type): adapts kl_coef toward kl_target
    kl_target: float = 0.1  # adaptive: target per-token KL (verl kl_ctrl.target_kl)
    kl_horizon: float = 10000.0  # adaptive: horizon in samples (verl kl_ctrl.horizon)
    drop_equal_reward_groups: bool = False  # DAPO dynamic sampling (MindSpeed-RL filter_groups_enable)
    # groups whose rewards are all equal are filtered before the trainer and replaced by more prompts;
    # at most (filter_groups_max_batches - 1) x global batch x train_iters groups per run (<= 0: no cap;
    #   verl and MindSpeed-RL write -1)
    filter_groups_max_batches: int = 10
    # what "all equal" is judged on (asp_npu.data.shaping): reward = the final reward, after the
    # overlong penalty (verl seq_reward) | score = the verifiers' weighted sum before it (verl acc /
    # score) | a name in reward.verifier_function = that verifier's own score (MindSpeed-RL acc_for_dapo)
    filter_groups_metric: str = "reward"
    # DAPO overlong reward shaping: a response longer than max_tokens - overlong_buffer loses
    # (length - (max_tokens - overlong_buffer)) / overlong_buffer x overlong_buffer_penalty_factor
    overlong_buffer_enable: bool = False
    overlong_buffer: int = 0
    overlong_buffer_penalty_factor: float = 1.0
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
    layout: str = ""  # "" = the layout as given | auto: the simulator's layout search (asp_npu.deploy.search)


@dataclass
class TrainerConfig(Section):
    """Run bookkeeping (verl `trainer` section)."""

    train_iters: int = 10
    run_dir: str = "runs/latest"
    save_freq: int = 10  # checkpoint (trainer + pipeline state: an exact resume) every this many trainer
    # steps; 0 = only at the end; < 0 = never (a SIGTERM/SIGINT still checkpoints)
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    project_name: str = "asp-npu"  # wandb / swanlab project (verl trainer.project_name)
    experiment_name: str = ""  # wandb / swanlab run name ("" = the run directory's name)
    test_freq: int = 0  # validate on data.val_files every this many trainer steps and at the end (<= 0: no)
    device: str = "auto"  # auto | cpu | npu | cuda
    nnodes: int = 1
    ray_address: str = ""  # join this running Ray cluster ("auto" | "host:port"); "" = RAY_ADDRESS, else a
    # private single-machine Ray
    n_devices_per_node: int = 0  # 0 = detect
    card: str = ""  # accelerator model for `asp-npu check`: 910b | 910b4 | a2 | a3 ("" = 910b)
    host_memory_gib: float = 0.0  # host (CPU) memory per node for `asp-npu check`; 0 = the card's default
    # host Adam seconds per offloaded parameter of a rank (optimizer_cpu_offload) for `asp-npu check` and
    # the layout search: `asp-npu calibrate` measures it (`check --calib FILE` reads it from the file);
    # 0 = the documented NPU-host figure (docs/layout.md)
    host_optimizer_s_per_param: float = 0.0
    stall_timeout_s: float = 300.0  # pipeline: fail with a clear error after this long without progress
    # a trainer rank that dies or hangs stops the run cleanly; it is then started again from the last
    # complete checkpoint this many times (1: a transient loss -- a killed process, a lost node -- costs
    # the steps since the checkpoint; a fault that repeats stops the run after one more try)
    max_restarts: int = 1
    critic_warmup: int = 0  # gae: the first this many trainer steps update the critic only (verl)


@dataclass
class RewardConfig(Section):
    """Rule rewards (MindSpeed-RL `rl_config.verifier_*`, verl `custom_reward_function`): data/rewards.py."""

    verifier_function: list[str] = field(default_factory=list)  # [] = the data_source's rule (auto)
    verifier_weight: list[float] = field(default_factory=list)  # reward = sum of weight x score; [] = 1 each
    verifier_timeout: float = 10.0  # seconds per verifier call; past it the call scores 0 (counted)
    verifier_parallel: int = 2  # verifier processes per rollout instance
    custom_function: str = ""  # path/to/file.py:fn, called as verl's custom_reward_function (name `custom`)


@dataclass
class SFTConfig(Section):
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
class MultiTurnConfig(Section):
    """Multi-turn tool-calling rollouts (asp_npu/rollout/multi_turn.py): verl
    `actor_rollout_ref.rollout.multi_turn`, MindSpeed-RL `rl_config.multi_turn_enable` and its keys."""

    enable: bool = False
    tools: list[str] = field(default_factory=lambda: ["calculator"])  # asp_npu.rollout.tools names
    tool_config_path: str = ""  # MindSpeed-RL / verl tools YAML: its tool_schema names replace `tools`
    max_assistant_turns: int = 4  # verl max_assistant_turns
    max_tool_calls: int = 3  # tool calls per trajectory (MindSpeed-RL max_tool_calls, verl max_user_turns)
    max_parallel_calls: int = 1  # calls run per assistant turn; more are answered with an error
    max_total_response_length: int = 0  # tokens of a whole trajectory's response (0 = sampling max_tokens)
    max_tool_response_length: int = 256  # characters of one tool output the model sees
    tool_response_truncate_side: str = "middle"  # left | middle | right
    format: str = "hermes"  # tool-call format (MindSpeed-RL tool_parser_format, verl format)
    tool_timeout_s: float = 10.0  # one tool call's wall-clock limit (then an error string)


@dataclass
class Config(Section):
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    generate_config: GenerateConfig = field(default_factory=GenerateConfig)
    actor_config: ActorConfig = field(default_factory=ActorConfig)
    critic_config: CriticConfig = field(default_factory=CriticConfig)
    rl_config: RLConfig = field(default_factory=RLConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)


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
        if mode is not None and not mode.allows_partial(rl.max_lag):
            out.append(f"rl_config.partial_rollout: mode '{rl.mode}' is synchronous or colocated; "
                       "partial rollout needs an asynchronous disaggregated mode")
        elif rl.weight_refresh_mode == "drain":
            out.append("rl_config.partial_rollout: needs rl_config.weight_refresh_mode=inflight "
                       "(a drained refresh lets every sequence finish on the old weights)")
    return out


# ------------------------------------------------------------------ multi-turn rollouts
def multi_turn_problems(mt: MultiTurnConfig) -> list[str]:
    """The tool-call format and truncation side; tool names are checked when the instances start."""
    from asp_npu.data.tool_format import FORMATS, TRUNCATE_SIDES

    out = []
    if mt.format not in FORMATS:
        out.append(f"multi_turn.format: '{mt.format}' is not one of {', '.join(FORMATS)}")
    if mt.tool_response_truncate_side not in TRUNCATE_SIDES:
        out.append(f"multi_turn.tool_response_truncate_side: '{mt.tool_response_truncate_side}' is not "
                   f"one of {', '.join(TRUNCATE_SIDES)}")
    if mt.enable and not (mt.tools or mt.tool_config_path):
        out.append("multi_turn.tools: empty (name at least one tool, or multi_turn.tool_config_path)")
    return out


# ------------------------------------------------------------------ the loss (rl_config keys)
def loss_problems(cfg: Config) -> list[str]:
    """Loss settings that cannot run as given: verl's dual clip needs c > 1; truncated sampling (top_p < 1,
    top_k, min_p) with the off-policy correction on would mis-weight every token."""
    rl = cfg.rl_config
    out = []
    if 0 < rl.clip_ratio_c <= 1:
        out.append(f"rl_config.clip_ratio_c: must be > 1 (dual clip) or 0 (off) (got {rl.clip_ratio_c})")
    if rl.importance_cap > 0:
        out += truncation_problems(cfg.generate_config.sampling_config)
    return out


def truncation_problems(sc: SamplingConfig) -> list[str]:
    """Sampling that truncates the distribution, refused with the importance correction on: vLLM's
    processed logprobs (the behaviour policy the rollout records) are those of the distribution after
    top_k, top_p and min_p dropped tokens and renormalised the rest, the trainer's are of the whole one, so
    pi_prox / pi_b carries the factor Z = the kept mass <= 1 on every token: every weight is biased below 1
    by how much was cut, not by how far the policies moved."""
    cuts = [(f"top_p: {sc.top_p} < 1", sc.top_p < 1), (f"top_k: {sc.top_k} > 0", sc.top_k > 0),
            (f"min_p: {sc.min_p} > 0", sc.min_p > 0)]
    return [f"generate_config.sampling_config.{what} with rl_config.importance_cap > 0: the rollout's "
            "logprobs are of the truncated, renormalised distribution and the trainer's are not, so every "
            "token would get an importance weight below 1; sample from the whole distribution or set "
            "importance_cap 0" for what, on in cuts if on]


# Allowed range of each numeric field: "section.key" -> (low, high, low_exclusive, high_exclusive); None =
# unbounded. A numeric field not listed here must be finite and >= 0 (`range_problems`), so a key added
# to a dataclass above is range-checked without an entry; list it only when its range differs.
Range = tuple[float | None, float | None, bool, bool]
AT_LEAST_1: Range = (1, None, False, False)
POSITIVE: Range = (0, None, True, False)
FRACTION: Range = (0, 1, True, False)  # (0, 1]
NUMERIC_RANGES: dict[str, Range] = {
    "data.num_prompts": (0, None, False, False),  # 0 = every prompt of data.data_path (synthetic: 256)
    "trainer.test_freq": (-1, None, False, False),  # verl's -1 = never
    "generate_config.val_kwargs.top_p": FRACTION,
    "generate_config.val_kwargs.n": AT_LEAST_1,
    "generate_config.num_instances": AT_LEAST_1,
    "generate_config.infer_tensor_parallel_size": AT_LEAST_1,
    "generate_config.infer_expert_parallel_size": AT_LEAST_1,
    "generate_config.max_num_seqs": AT_LEAST_1,
    "generate_config.max_num_batched_tokens": AT_LEAST_1,
    "generate_config.kv_cache_gib": POSITIVE,
    "generate_config.gpu_memory_utilization": FRACTION,
    "generate_config.sampling_config.top_p": FRACTION,
    "generate_config.sampling_config.top_k": (-1, None, False, False),  # -1 / 0: off (vLLM)
    "generate_config.sampling_config.min_p": (0, 1, False, False),
    "generate_config.sampling_config.max_tokens": AT_LEAST_1,
    "actor_config.tensor_model_parallel_size": AT_LEAST_1,
    "actor_config.pipeline_model_parallel_size": AT_LEAST_1,
    "actor_config.data_parallel_size": AT_LEAST_1,
    "actor_config.expert_model_parallel_size": AT_LEAST_1,
    "actor_config.context_parallel_size": AT_LEAST_1,
    "actor_config.micro_batch_size": AT_LEAST_1,
    "actor_config.ppo_epochs": AT_LEAST_1,
    "actor_config.ppo_max_token_len_per_gpu": AT_LEAST_1,
    "actor_config.lr_warmup_fraction": (0, 1, False, True),
    "actor_config.adam_beta1": (0, 1, False, True),
    "actor_config.adam_beta2": (0, 1, False, True),
    "actor_config.adam_eps": POSITIVE,
    "actor_config.optimizer_offload_fraction": (0, 1, False, False),
    "critic_config.tensor_model_parallel_size": AT_LEAST_1,
    "critic_config.pipeline_model_parallel_size": AT_LEAST_1,
    "critic_config.micro_batch_size": AT_LEAST_1,
    "critic_config.ppo_epochs": AT_LEAST_1,
    "critic_config.lr_warmup_fraction": (0, 1, False, True),
    "critic_config.adam_beta1": (0, 1, False, True),
    "critic_config.adam_beta2": (0, 1, False, True),
    "critic_config.adam_eps": POSITIVE,
    "rl_config.gamma": (0, 1, False, False),
    "rl_config.lam": (0, 1, False, False),
    "rl_config.n_samples_per_prompt": AT_LEAST_1,
    "rl_config.mini_batch_size": AT_LEAST_1,
    "rl_config.weight_refresh_interval": AT_LEAST_1,
    "rl_config.clip_ratio_low": (0, 1, False, False),
    "rl_config.importance_cap": (0, None, False, False),  # 0 = no off-policy correction
    "rl_config.filter_groups_max_batches": (-1, None, False, False),  # -1 / 0: no cap (verl, MindSpeed-RL)
    "rl_config.kl_target": POSITIVE,
    "actor_config.lora_alpha": POSITIVE,
    "rl_config.kl_horizon": POSITIVE,
    "rl_config.max_prompt_length": AT_LEAST_1,
    "rl_config.plan_cost_a": POSITIVE,
    "trainer.train_iters": AT_LEAST_1,
    "trainer.nnodes": AT_LEAST_1,
    "trainer.stall_timeout_s": POSITIVE,
    "rl_config.instance_timeout_s": POSITIVE,  # max_request_retries: the default range (>= 0)
    "sft.batch_size": AT_LEAST_1,
    "sft.num_examples": AT_LEAST_1,
    "sft.max_items": AT_LEAST_1,
    "reward.verifier_timeout": POSITIVE,
    "reward.verifier_parallel": AT_LEAST_1,
    "multi_turn.max_assistant_turns": AT_LEAST_1,
    "multi_turn.max_parallel_calls": AT_LEAST_1,
    "multi_turn.tool_timeout_s": POSITIVE,
}
DEFAULT_RANGE: Range = (0, None, False, False)
# Allowed values of the string fields the code branches on (the rest: see validate below).
LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "swanlab")  # asp_npu.observe.metrics.MetricsLogger
# remax: each rollout instance generates one extra greedy response per group (its reward, the baseline)
ADV_ESTIMATORS = ("group_norm", "gae", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gpg",
                  "remax")
ESTIMATOR_ALIASES = {"grpo": "group_norm"}  # verl's names for ours (the importer maps them)
GAMMA_ESTIMATORS = ("reinforce_plus_plus", "gae")  # the estimators that read rl_config.gamma
KL_PENALTIES = ("low_var_kl", "kl", "mse", "abs", "k1", "k2", "k3")  # asp_npu.trainer.losses.KL_PENALTIES
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_CTRL_TYPES = ("fixed", "adaptive")  # asp_npu.trainer.losses.KL_CTRL_TYPES
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


def estimator_problems(rl: RLConfig) -> list[str]:
    """`adv_estimator` one that runs (a misspelling gets a suggestion), and no key it ignores set."""
    import difflib

    name = rl.adv_estimator
    if name not in ADV_ESTIMATORS:
        close = [ESTIMATOR_ALIASES[name]] if name in ESTIMATOR_ALIASES else \
            difflib.get_close_matches(name, ADV_ESTIMATORS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return [f"rl_config.adv_estimator: '{name}' is not one of {', '.join(ADV_ESTIMATORS)}{hint}"]
    out = []
    if rl.gamma != 1.0 and name not in GAMMA_ESTIMATORS:
        out.append(f"rl_config.gamma: {rl.gamma} has no effect with adv_estimator {name} (only "
                   f"{', '.join(GAMMA_ESTIMATORS)} discounts); leave it at 1.0")
    if not rl.norm_adv_by_std_in_grpo and name != "group_norm":
        out.append(f"rl_config.norm_adv_by_std_in_grpo: false has no effect with adv_estimator {name} "
                   "(only group_norm divides by the group's std); leave it true")
    return out


def _choice_problems(cfg: Config) -> list[str]:
    """String fields with a fixed set of values."""
    problems: list[str] = []
    unknown = [lg for lg in cfg.trainer.logger if lg not in LOGGERS]
    if unknown:
        problems.append(f"trainer.logger: '{unknown[0]}' is not one of {', '.join(LOGGERS)}")
    problems += estimator_problems(cfg.rl_config)
    for key, value, allowed in (("rl_config.kl_penalty", cfg.rl_config.kl_penalty, KL_PENALTIES),
                                ("rl_config.loss_agg_mode", cfg.rl_config.loss_agg_mode, LOSS_AGG_MODES),
                                ("rl_config.kl_ctrl_type", cfg.rl_config.kl_ctrl_type, KL_CTRL_TYPES),
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
    problems += multi_turn_problems(cfg.multi_turn)
    problems += loss_problems(cfg)
    problems += data_problems(cfg)
    if cfg.data.length_dist:
        from asp_npu.data.tasks import parse_length_dist

        try:
            parse_length_dist(cfg.data.length_dist)
        except UserError as exc:
            problems.append(f"data.length_dist: {exc}")
    if act.cpu_cores and not all(c.strip().isdigit() for c in act.cpu_cores.split(",")):
        problems.append(f"actor_config.cpu_cores: '{act.cpu_cores}' is not a comma-separated list of cores")
    problems += _trainer_feature_problems(act, rl.mode)
    problems += lora_problems(act)
    problems += optimizer_problems(act, cfg.trainer.train_iters)
    problems += _layout_auto_problems(cfg)
    problems += _npu_rollout_problems(gen)
    if gen.weight_transfer not in WEIGHT_TRANSFERS:
        problems.append(f"generate_config.weight_transfer: '{gen.weight_transfer}' is not "
                        f"{'|'.join(WEIGHT_TRANSFERS)}")
    if gen.admission not in ("continuous", "unit"):
        problems.append(f"generate_config.admission: '{gen.admission}' is not continuous|unit")
    from asp_npu.device import DEVICE_SETTINGS

    if cfg.trainer.device not in DEVICE_SETTINGS:
        problems.append(f"trainer.device: '{cfg.trainer.device}' is not auto|cpu|npu|cuda")
    if cfg.model.dtype not in ("float32", "bfloat16", "float16"):
        problems.append(f"model.dtype: '{cfg.model.dtype}' is not float32|bfloat16|float16")
    if not cfg.model.build_if_missing and not Path(cfg.model.path).exists():
        problems.append(f"model.path: '{cfg.model.path}' does not exist")
    problems += _arch_problems(cfg)
    problems += _reward_problems(cfg)
    problems += _load_megatron_problems(cfg)
    problems += critic_problems(cfg)
    return problems


def critic_problems(cfg: Config) -> list[str]:
    """PPO with a critic: the critic's layout and schedule, and the keys that only mean something with
    (or without) it."""
    rl, cr, out = cfg.rl_config, cfg.critic_config, []
    if rl.adv_estimator != "gae":
        changed = [f"critic_config.{f.name}" for f in fields(cr) if getattr(cr, f.name) != f.default]
        changed += ["trainer.critic_warmup"] * (cfg.trainer.critic_warmup > 0)
        if changed:
            out.append(f"{changed[0]}: only used by PPO with a critic (rl_config.adv_estimator=gae), "
                       f"not '{rl.adv_estimator}'; remove it or set adv_estimator gae")
        return out
    if not rl.norm_adv_by_std_in_grpo:
        out.append("rl_config.norm_adv_by_std_in_grpo: a group_norm (GRPO) key; adv_estimator gae whitens "
                   "its advantages over the minibatch; remove it")
    if rl.use_kl_in_reward:
        out.append("rl_config.use_kl_in_reward: not supported with adv_estimator gae yet (the KL would have "
                   "to enter each token's reward); use kl_coef in the loss")
    if cr.lr_decay_style not in LR_DECAY_STYLES:
        out.append(f"critic_config.lr_decay_style: '{cr.lr_decay_style}' is not {'|'.join(LR_DECAY_STYLES)}")
    if cr.min_lr > cr.lr:
        out.append(f"critic_config.min_lr: {cr.min_lr} is above lr {cr.lr}")
    if cfg.trainer.critic_warmup >= cfg.trainer.train_iters:
        out.append(f"trainer.critic_warmup: {cfg.trainer.critic_warmup} steps leave no policy update in "
                   f"trainer.train_iters={cfg.trainer.train_iters}")
    out += _critic_world_problems(cfg)
    if cr.sequence_parallel and cr.tensor_model_parallel_size < 2:
        out.append("critic_config.sequence_parallel: needs tensor_model_parallel_size > 1")
    layers = cfg.model.arch.num_layers or _hf_layers(cfg.model.path)
    pp = cr.pipeline_model_parallel_size
    if layers and pp >= 1 and layers % pp:
        out.append(f"critic_config.pipeline_model_parallel_size: {pp} does not divide the model's {layers} "
                   "layers")
    heads = cfg.model.arch.num_attention_heads or _hf_int(cfg.model.path, "num_attention_heads")
    tp = cr.tensor_model_parallel_size
    if heads and tp >= 1 and heads % tp:
        out.append(f"critic_config.tensor_model_parallel_size: {tp} does not divide the model's {heads} "
                   "attention heads")
    return out


def _critic_world_problems(cfg: Config) -> list[str]:
    """The critic's ranks sit on the trainer's (colocated): its TP x PP must divide them."""
    cr, act = cfg.critic_config, cfg.actor_config
    world = (act.tensor_model_parallel_size * act.pipeline_model_parallel_size * act.data_parallel_size
             * act.context_parallel_size)
    tp_pp = cr.tensor_model_parallel_size * cr.pipeline_model_parallel_size
    if min(world, tp_pp) < 1 or cr.data_parallel_size:
        return []
    if world % tp_pp:
        return [f"critic_config: TP {cr.tensor_model_parallel_size} x PP {cr.pipeline_model_parallel_size} "
                f"does not divide the trainer's {world} ranks the critic is colocated with"]
    return []


def _hf_int(path: str, key: str) -> int:
    """An integer of model.path/config.json (0: no such file or key)."""
    import json

    cfg_json = Path(path) / "config.json"
    if not cfg_json.is_file():
        return 0
    try:
        return int(json.loads(cfg_json.read_text()).get(key, 0) or 0)
    except (ValueError, OSError):
        return 0


def _hf_layers(path: str) -> int:
    return _hf_int(path, "num_hidden_layers")


def _reward_problems(cfg: Config) -> list[str]:
    """Verifier names and weights, the custom reward function, the prompt template."""
    from asp_npu.data.rewards import reward_problems
    from asp_npu.data.templates import template_problems

    return reward_problems(cfg.reward) + template_problems(cfg.data.prompt_type, cfg.data.chat_template)


def data_problems(cfg: Config) -> list[str]:
    """Dataset layout, held-out set for validation, DAPO dynamic sampling and overlong buffer."""
    from asp_npu.data.datasets import LAYOUTS, MINDSPEED_CANDIDATES

    d, rl, out = cfg.data, cfg.rl_config, []
    if d.layout not in LAYOUTS:
        out.append(f"data.layout: '{d.layout}' is not one of {', '.join(LAYOUTS)}")
    unknown = sorted(set(d.map_keys) - set(MINDSPEED_CANDIDATES))
    if unknown:
        out.append(f"data.map_keys: unknown role '{unknown[0]}' (known: {', '.join(MINDSPEED_CANDIDATES)})")
    if d.val_files and not Path(d.val_files).is_file():
        out.append(f"data.val_files: '{d.val_files}' is not a file")
    if cfg.trainer.test_freq > 0 and d.data_path and not d.val_files:
        out.append("trainer.test_freq: validation needs a held-out set (set data.val_files)")
    if rl.drop_equal_reward_groups and rl.n_samples_per_prompt < 2:
        out.append("rl_config.drop_equal_reward_groups: a group of one sample always has equal rewards "
                   "(set n_samples_per_prompt >= 2)")
    out += filter_metric_problems(cfg)
    max_tokens = cfg.generate_config.sampling_config.max_tokens
    if rl.overlong_buffer_enable and not 0 < rl.overlong_buffer < max_tokens:
        out.append(f"rl_config.overlong_buffer: must be in (0, max_tokens={max_tokens}) when "
                   f"overlong_buffer_enable (got {rl.overlong_buffer})")
    return out


def filter_metric_problems(cfg: Config) -> list[str]:
    """`rl_config.filter_groups_metric`: reward, score, or a verifier the reward sums (its score is recorded
    per trajectory only then); checked where dynamic sampling is on, as MindSpeed-RL checks it."""
    from asp_npu.data.rewards import verifier_names
    from asp_npu.data.shaping import FILTER_METRICS

    metric = cfg.rl_config.filter_groups_metric
    if metric in FILTER_METRICS or not cfg.rl_config.drop_equal_reward_groups:
        return []
    names = verifier_names(cfg.reward.verifier_function, cfg.reward.custom_function)
    if metric in names:
        return []
    return [f"rl_config.filter_groups_metric: '{metric}' is not {' | '.join(FILTER_METRICS)} nor a verifier "
            f"in reward.verifier_function {names}"]


def _load_megatron_problems(cfg: Config) -> list[str]:
    """`model.load_megatron`: a complete Megatron checkpoint whose TP/PP/EP split fits model.path's
    heads, layers and experts (names only: nothing is read). Like model.path, a folder that is not
    here is only refused without model.build_if_missing (`check` and `import-config` look at a config
    whose folders live on the cluster)."""
    path = cfg.model.load_megatron
    if not path or (cfg.model.build_if_missing and not Path(path).exists()):
        return []
    from asp_npu.arch import ModelDims
    from asp_npu.data.megatron_folder import dims_problems, locate

    try:
        folder = locate(path)
        if not (Path(cfg.model.path) / "config.json").is_file():
            return []  # built by init-model, or reported as model.path
        return dims_problems(folder, ModelDims.from_hf_dir(cfg.model.path))
    except UserError as exc:
        return [str(exc)]


def foreign_load(cfg: Config) -> Config:
    """MindSpeed-RL's `actor_config.load` names Megatron weights (e.g. a MindSpeed-LLM conversion,
    ./qwen3_32b_tp8pp2): they are the initial policy (`model.load_megatron`), not a run to resume. An
    asp-npu checkpoint (latest.json / trainer.json) stays a resume."""
    load = cfg.actor_config.load
    if load and not cfg.model.load_megatron:
        from asp_npu.data.megatron_folder import is_megatron

        if is_megatron(load):
            changed: Config = with_changes(cfg, {"model.load_megatron": load, "actor_config.load": ""})
            return changed
    return cfg


def _arch_problems(cfg: Config) -> list[str]:
    """Model family and expert parallelism: unknown families, MLA, EP not dividing experts or DP."""

    from asp_npu.arch import ARCHS, MLA_MISSING, hf_arch_problems
    from asp_npu.core.layout import expert_problems, stage_problems

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
    problems += packing_problems(act, experts)
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


def packing_problems(act: ActorConfig, experts: int) -> list[str]:
    """Why `actor_config.use_remove_padding` cannot run with these settings (empty: it can)."""
    if not act.use_remove_padding:
        return []
    problems = []
    if act.context_parallel_size > 1:
        problems.append(f"actor_config.use_remove_padding: packed sequences with context_parallel_size="
                        f"{act.context_parallel_size} are not supported (the CP split would have to cut each "
                        "packed sequence into its own 2 x CP chunks); set one of them off")
    if experts:
        problems.append("actor_config.use_remove_padding: not supported for a MoE model yet (its allgather "
                        "dispatcher needs equal token blocks on every data-parallel rank); set it false")
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


LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")  # asp_npu.trainer.lora


def lora_problems(act: ActorConfig) -> list[str]:
    """LoRA settings the trainer cannot build: a rank without targets or the reverse, unknown layers."""
    if not act.lora_r and not act.lora_target_modules:
        return []
    unknown = [t for t in act.lora_target_modules if t not in LORA_TARGETS]
    if unknown:
        return [f"actor_config.lora_target_modules: '{unknown[0]}' is not a layer LoRA applies to "
                f"(one of {'|'.join(LORA_TARGETS)})"]
    if act.lora_r < 1:
        return [f"actor_config.lora_r: must be >= 1 when lora_target_modules is set (got {act.lora_r})"]
    if not act.lora_target_modules:
        return [f"actor_config.lora_target_modules: empty with lora_r {act.lora_r}; name the layers "
                f"({'|'.join(LORA_TARGETS)})"]
    return []


LR_DECAY_STYLES = ("constant", "linear", "cosine")  # megatron-core OptimizerParamScheduler styles we test
WD_INCR_STYLES = ("constant", "linear", "cosine")


def warmup_and_decay_iters(act: ActorConfig, train_iters: int) -> tuple[float, int]:
    """(warm-up, decay) length in iterations, as megatron derives them: the warm-up is
    `lr_warmup_fraction` of the decay when set, else `lr_warmup_iters`; the decay ends at
    `lr_decay_iters` (0 = the whole run)."""
    decay = act.lr_decay_iters or train_iters
    return (act.lr_warmup_fraction * decay if act.lr_warmup_fraction else float(act.lr_warmup_iters)), decay


def optimizer_problems(act: ActorConfig, train_iters: int) -> list[str]:
    """Schedule and host-offload settings megatron-core's scheduler / HybridDeviceOptimizer refuse."""
    out: list[str] = []
    if act.lr_decay_style not in LR_DECAY_STYLES:
        out.append(f"actor_config.lr_decay_style: '{act.lr_decay_style}' is not {'|'.join(LR_DECAY_STYLES)}")
    if act.weight_decay_incr_style not in WD_INCR_STYLES:
        out.append(f"actor_config.weight_decay_incr_style: '{act.weight_decay_incr_style}' is not "
                   f"{'|'.join(WD_INCR_STYLES)}")
    elif act.weight_decay_incr_style != "constant" and act.end_weight_decay < act.start_weight_decay:
        out.append(f"actor_config.end_weight_decay: {act.end_weight_decay} is below start_weight_decay "
                   f"{act.start_weight_decay} (megatron's schedule only increases weight decay)")
    if act.min_lr > act.lr:
        out.append(f"actor_config.min_lr: {act.min_lr} is above lr {act.lr}")
    if act.lr_warmup_init > act.lr:
        out.append(f"actor_config.lr_warmup_init: {act.lr_warmup_init} is above lr {act.lr}")
    if act.lr_warmup_fraction and act.lr_warmup_iters:
        out.append("actor_config.lr_warmup_fraction: set it or lr_warmup_iters, not both")
    warmup, decay = warmup_and_decay_iters(act, train_iters)
    if train_iters >= 1 and (warmup >= decay or warmup > train_iters):
        key = "lr_warmup_fraction" if act.lr_warmup_fraction else "lr_warmup_iters"
        out.append(f"actor_config.{key}: a warm-up of {warmup:g} iterations is not shorter than "
                   f"the decay ({decay} iterations) and the run (trainer.train_iters={train_iters})")
    if act.optimizer_cpu_offload and not act.use_distributed_optimizer:
        out.append("actor_config.optimizer_cpu_offload: needs actor_config.use_distributed_optimizer=true "
                   "(megatron-core's HybridDeviceOptimizer runs inside the distributed optimizer)")
    if act.optimizer_cpu_offload and act.offload_train_optimizer:
        out.append("actor_config.offload_train_optimizer: optimizer_cpu_offload keeps the optimizer state on "
                   "the host already; set one of them")
    return out


# the keys `rl_config.layout: auto` chooses itself (asp_npu.deploy.search)
AUTO_LAYOUT_KEYS = (
    ("generate_config", "num_instances"), ("generate_config", "infer_tensor_parallel_size"),
    ("actor_config", "tensor_model_parallel_size"), ("actor_config", "pipeline_model_parallel_size"),
    ("actor_config", "context_parallel_size"), ("actor_config", "data_parallel_size"),
)


def _layout_auto_problems(cfg: Config) -> list[str]:
    """`layout: auto` and a fixed split given explicitly (a key away from its default) contradict."""
    layout = cfg.rl_config.layout
    if layout not in ("", "auto"):
        return [f"rl_config.layout: '{layout}' is not auto (or empty: the layout as given)"]
    if layout != "auto":
        return []
    fixed = [f"{sec}.{key}={getattr(getattr(cfg, sec), key)}" for sec, key in AUTO_LAYOUT_KEYS
             if getattr(getattr(cfg, sec), key) != getattr(getattr(Config(), sec), key)]
    if fixed:
        return [f"rl_config.layout: auto chooses the layout itself, but a fixed one is given "
                f"({', '.join(fixed)}); remove those keys or the layout: auto"]
    return []


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
        cfg: Config = foreign_load(OmegaConf.to_object(base))  # type: ignore[arg-type]
    except (OmegaConfBaseException, TypeError, ValueError) as exc:
        raise ConfigError(f"{path or 'config'}: {_key_problem(exc)}") from None
    if check:
        problems = validate(cfg)
        if problems:
            raise ConfigError("; ".join(problems))
        freeze(cfg)
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


def freeze(cfg: Any) -> Any:
    """Make every section of `cfg` read-only (a write raises FrozenInstanceError); returns `cfg`."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if is_dataclass(value):
            freeze(value)
    object.__setattr__(cfg, "_frozen", True)
    return cfg


def is_frozen(cfg: Any) -> bool:
    return bool(cfg.__dict__.get("_frozen", False))


def with_changes(cfg: Any, changes: Mapping[str, Any]) -> Any:
    """A copy of `cfg` (or of one section) with `section.key` values replaced; frozen if `cfg` was."""
    direct: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in changes.items():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            direct[head] = value
    try:
        for head, sub in nested.items():
            direct[head] = with_changes(getattr(cfg, head), sub)
        new = replace(cfg, **direct)
    except (AttributeError, TypeError) as exc:
        raise ConfigError(f"config change {sorted(changes)}: {exc}") from None
    return freeze(new) if is_frozen(cfg) else new


# PPO: critic_config keys that are actor_config keys of the same meaning
SHARED_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size",
               "micro_batch_size", "ppo_epochs", "lr", "min_lr", "lr_decay_style", "lr_warmup_fraction",
               "weight_decay", "clip_grad", "adam_beta1", "adam_beta2", "adam_eps",
               "use_distributed_optimizer", "sequence_parallel", "seed")
# actor features the critic runs without (its own defaults)
PLAIN_ACTOR: dict[str, Any] = {
               "expert_model_parallel_size": 1, "expert_tensor_parallel_size": 0, "context_parallel_size": 1,
               "num_layer_list": [], "load": "", "use_dynamic_bsz": False, "use_remove_padding": False,
               "recompute_granularity": "", "recompute_method": "",
               "offload_train_optimizer": False, "offload_train_grad": False, "offload_train_param": False,
               "lr_warmup_iters": 0, "lr_warmup_init": 0.0, "lr_decay_iters": 0,
               "weight_decay_incr_style": "constant", "optimizer_cpu_offload": False}


def critic_dp(cfg: Config) -> int:
    """The critic's data-parallel size: `critic_config.data_parallel_size`, or (0) as many replicas as
    fill the trainer's ranks, on which the critic is colocated (at least 1)."""
    cr, act = cfg.critic_config, cfg.actor_config
    if cr.data_parallel_size:
        return cr.data_parallel_size
    world = (act.tensor_model_parallel_size * act.pipeline_model_parallel_size * act.data_parallel_size
             * act.context_parallel_size)
    return max(1, world // max(1, cr.tensor_model_parallel_size * cr.pipeline_model_parallel_size))


def critic_view(cfg: Config) -> Config:
    """`cfg` with `actor_config` replaced by the critic's layout and optimizer (`critic_config`), no
    reference model and no KL or entropy terms: what a `CriticWorker` / its `TrainerGroup` read."""
    cr = cfg.critic_config
    changes: dict[str, Any] = {f"actor_config.{k}": v for k, v in PLAIN_ACTOR.items()}
    changes.update({f"actor_config.{k}": getattr(cr, k) for k in SHARED_KEYS})
    changes["actor_config.data_parallel_size"] = critic_dp(cfg)
    changes.update({"rl_config.kl_coef": 0.0, "rl_config.entropy_coeff": 0.0,
                    "rl_config.use_kl_in_reward": False})
    view: Config = with_changes(cfg, changes)
    return view
