"""`asp-npu import-config mindspeed-rl FILE.yaml --out ours.yaml`: translate a MindSpeed-RL GRPO
config into an asp-npu config, naming every key that could not be mapped and why.

MindSpeed-RL's sections are `megatron_training` (shared Megatron defaults), `actor_config`,
`rl_config` and `generate_config`; model architecture lives in `configs/model/<name>.yaml`, pulled
in by Hydra `defaults`. Its integrated worker runs rollout and training on the same
`rl_config.actor_resource.num_npus` NPUs; asp-npu (mode `asp`) gives rollout instances and the
trainer their own NPUs, so the importer splits that NPU count between them with the layout search
(`asp_npu.deploy.search`: instances x instance TP, trainer TP/PP/CP/DP, recompute and optimizer offload,
the fitting split of best simulated throughput; `--mode mindspeed-sync` keeps the colocated layout).
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from asp_npu.config import Config, range_problems
from asp_npu.deploy.layout import COLOCATED_MODES, Card, card_for, plan_layout
from asp_npu.deploy.memory import instance_npus
from asp_npu.errors import UserError

# Public architecture numbers (HF config.json of each model) for MindSpeed-RL's model names, used
# when the MindSpeed model yaml is not next to the imported file.
KNOWN_MODELS: dict[str, dict[str, Any]] = {
    "qwen25_7b": dict(
        hidden_size=3584,
        num_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        intermediate_size=18944,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
    ),
    "qwen25_32b": dict(
        hidden_size=5120,
        num_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
        vocab_size=152064,
        intermediate_size=27648,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
    ),
    "qwen3_8b": dict(
        model_type="qwen3",
        hidden_size=4096,
        num_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        intermediate_size=12288,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
    ),
    "qwen3_32b": dict(
        model_type="qwen3",
        hidden_size=5120,
        num_layers=64,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        intermediate_size=25600,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
    ),
    "qwen3_30b_a3b": dict(
        model_type="qwen3_moe",
        hidden_size=2048,
        num_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=151936,
        intermediate_size=6144,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        num_experts=128,
        moe_router_topk=8,
        moe_ffn_hidden_size=768,
    ),
    "qwen3_235b_a22b": dict(
        model_type="qwen3_moe",
        hidden_size=4096,
        num_layers=94,
        num_attention_heads=64,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=151936,
        intermediate_size=12288,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        num_experts=128,
        moe_router_topk=8,
        moe_ffn_hidden_size=1536,
    ),
    "deepseekv3_671b": dict(
        model_type="deepseek_v3",
        hidden_size=7168,
        num_layers=61,
        num_attention_heads=128,
        num_key_value_heads=128,
        vocab_size=129280,
        intermediate_size=18432,
        max_position_embeddings=163840,
        tie_word_embeddings=False,
        num_experts=256,
        moe_router_topk=8,
        moe_ffn_hidden_size=2048,
        moe_shared_expert_intermediate_size=2048,
        first_k_dense_replace=3,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_head_dim=128,
        qk_pos_emb_head_dim=64,
        v_head_dim=128,
    ),
    "llama32_1b": dict(
        model_type="llama",
        hidden_size=2048,
        num_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        intermediate_size=8192,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
    ),
}

_KERNEL = "MindSpeed kernel/feature switch: MindSpeed's adaptor applies its NPU kernels; no asp-npu key"
_DATA = "option of MindSpeed's preprocessed (Megatron-format) datasets; asp-npu reads JSONL/Parquet directly"
_HF = "model hyper-parameter: asp-npu takes it from the HF config.json of model.path"
_SCHED = "MindSpeed-RL TransferDock/dispatch tuning: asp-npu's planner and TrainQueue decide dispatch"
_SHUFFLE = ("no effect on the trained result: an asp-npu trainer step is one minibatch, so there is no "
            "minibatch order to shuffle (its micro-batches are summed)")
_REWARD = "asp-npu scores with the dataset's reward function (data.task / each row's data_source)"
_LOG = "logger option: asp-npu logs to trainer.logger (console, jsonl, tensorboard)"
# MindSpeed-RL key -> why asp-npu cannot run such a config at all (none since PPO, LoRA and multi-turn)
_REFUSED: dict[str, str] = {}

# section -> key -> (our dotted key, converter) | reason string (could not map)
_DIRECT = {
    "tokenizer_name_or_path": "model.path",
    "train_iters": "trainer.train_iters",
    "global_batch_size": "rl_config.global_batch_size",
    "data_path": "data.data_path",
    "save_interval": "trainer.save_freq",
    "use_distributed_optimizer": "actor_config.use_distributed_optimizer",
    "sequence_parallel": "actor_config.sequence_parallel",
    "recompute_granularity": "actor_config.recompute_granularity",
    "recompute_method": "actor_config.recompute_method",
    "recompute_num_layers": "actor_config.recompute_num_layers",
    "expert_model_parallel_size": "actor_config.expert_model_parallel_size",
    "micro_batch_size": "actor_config.micro_batch_size",
    "tensor_model_parallel_size": "actor_config.tensor_model_parallel_size",
    "pipeline_model_parallel_size": "actor_config.pipeline_model_parallel_size",
    "lr": "actor_config.lr",
    "weight_decay": "actor_config.weight_decay",
    "clip_grad": "actor_config.clip_grad",
    "load": "model.load_megatron",  # MindSpeed-LLM-converted Megatron weights: the initial policy
    "save": "actor_config.save",
    **{k: f"actor_config.{k}" for k in (  # the lr schedule and Adam (asp_npu.trainer.optim)
        "lr_decay_style", "min_lr", "lr_warmup_fraction", "lr_warmup_iters", "lr_warmup_init",
        "lr_decay_iters", "adam_beta1", "adam_beta2", "adam_eps", "weight_decay_incr_style",
        "start_weight_decay", "end_weight_decay")},
}
# MindSpeed-RL's own defaults (its MegatronConfig) for the optimizer keys a config may leave out
_MINDSPEED_OPTIM_DEFAULTS = {"lr_decay_style": "linear", "weight_decay": 0.01}
_TRAINING_REASONS = {
    **dict.fromkeys(
        (
            "use_fused_rmsnorm",
            "use_mcore_models",
            "use_flash_attn",
            "no_masked_softmax_fusion",
            "attention_softmax_in_fp32",
            "no_gradient_accumulation_fusion",
            "use_fused_swiglu",
            "use_fused_rotary_pos_emb",
            "use_mc2",
            "use_ascend_coc",
            "coc_fused_kernel",
            "coc_parallel_num",
            "use_fused_ring_attention_update",
            "use_cp_send_recv_overlap",
        ),
        _KERNEL,
    ),
    **dict.fromkeys(
        (
            "split",
            "no_shuffle",
            "full_shuffle_instruction_dataset",
            "dataset_additional_keys",
            "variable_seq_lengths",
            "reset_position_ids",
            "reset_attention_mask",
            "is_instruction_dataset",
            "prompt_type",
        ),
        _DATA,
    ),
    **dict.fromkeys(
        (
            "attention_dropout",
            "hidden_dropout",
            "init_method_std",
            "rotary_base",
            "make_vocab_size_divisible_by",
            "padded_vocab_size",
            "norm_epsilon",
        ),
        _HF,
    ),
    "tokenizer_type": "the tokenizer is the one saved in model.path (HF)",
    "stage": "asp-npu always trains GRPO-style RL; the stage is implied",
    "distributed_backend": "chosen by asp_npu.device: hccl on NPU, nccl on CUDA, gloo on CPU",
    "no_shared_storage": "asp-npu expects model.path and data.data_path on every node",
    "seq_length": "asp-npu sizes training sequences as max_prompt_length + max_tokens (max_model_len)",
    "finetune": "asp-npu always starts from model.path (or model.load_megatron) without optimizer state",
    "no_load_optim": "resume semantics are asp-npu's own (trainer checkpoints hold the optimizer)",
    "no_load_rng": "resume semantics are asp-npu's own (trainer checkpoints hold the RNG)",
    "no_save_optim": "asp-npu checkpoints always hold the optimizer",
    "no_save_rng": "asp-npu checkpoints always hold the RNG",
    "gemm_gradient_accumulation_fusion": _KERNEL,
    "moe_alltoall_overlap_comm": _KERNEL,
    "shape_order": _KERNEL,
    "use_fused_moe_token_permute_and_unpermute": _KERNEL,
    "initial_loss_scale": "loss scaling is for fp16; bf16 trains unscaled",
    "use_rotary_position_embeddings": _HF,
    "no_pad_to_seq_lengths": _DATA,
}
_RL_REASONS = {
    **dict.fromkeys(
        (
            "actor_forward_micro_batch_size",
            "ref_forward_micro_batch_size",
            "reward_dispatch_size",
            "adv_dispatch_size",
            "actor_update_dispatch_size",
            "actor_rollout_dispatch_size",
            "actor_logprob_dispatch_size",
            "ref_dispatch_size",
            "guarantee_order",
            "num_cpus_for_local_task",
            "actor_max_packing_token_size",
            "use_dp_batch_balance",
        ),
        _SCHED,
    ),
    **dict.fromkeys(
        (
            "wandb_save_dir",
            "log_max_throughput",
        ),
        _LOG,
    ),
    "gamma": "GAE discount: group_norm advantages do not use it (adv_estimator gae maps it)",
    "lam": "GAE lambda: group_norm advantages do not use it (adv_estimator gae maps it)",
    **dict.fromkeys(("shuffle_mini_batch", "shuffle_minibatch"), _SHUFFLE),
    **dict.fromkeys(
        ("rule_reward", "verifier_function", "verifier_weight", "verifier_parallel", "verifier_timeout"),
        _REWARD,
    ),
    **dict.fromkeys(
        ("filter_groups_train_batch_size",),
        "asp-npu's dynamic sampling (drop_equal_reward_groups) filters groups whose filter metric is all "
        "equal and refills every minibatch to mini_batch_size",
    ),
    "clip_higher_enable": "asp-npu always clips with clip_ratio_low / clip_ratio_high (equal = PPO's clip)",
    "cliprange_value": "value clipping needs a critic (adv_estimator gae maps it)",
    "async_engine": "asp-npu's rollout engines are always asynchronous (vLLM AsyncLLM)",
    "rollout_max_tokens": "DAPO's overlong-buffer length; the response cap is sampling_config.max_tokens",
    "max_packing_token_size": "actor_config.ppo_max_token_len_per_gpu holds the update's token budget",
    "partial_rollout_max_split": "no split count in asp-npu: partial rollout (rl_config.partial_rollout) "
    "keeps sequences decoding across refreshes, every token within rl_config.max_token_lag",
    "reference_resource": "the reference model shares the trainer's NPUs in asp-npu",
    "reward_resource": "reward models are not supported; rewards are rule-based",
}
_OFFLOAD = (
    "only meaningful when rollout and training share NPUs (integrated worker): import with "
    "--mode mindspeed-sync to keep it"
)
_GEN_REASONS = {
    "trust_remote_code": "asp-npu loads Qwen2/Llama-family HF folders without remote code",
    "offload_train_optimizer": _OFFLOAD,
    "offload_train_grad": _OFFLOAD,
    "offload_train_param": _OFFLOAD,
    "enable_prefix_caching": "asp-npu always enables vLLM prefix caching (samples of a prompt share it)",
    "torchair_graph": "vllm-ascend torchair graph mode: asp-npu runs graph or eager from enforce_eager",
    "num_scheduler_steps": "vLLM V1 has no multi-step scheduling",
    "seed": "asp-npu seeds sampling from actor_config.seed",

    "limit_mm_image_per_prompt": "multimodal models are not supported",
}
_IMPLIED_DEFAULTS = {  # MindSpeed-RL key -> value that equals asp-npu's fixed behaviour
    # MindSpeed's defaults, which its adaptor applies to asp-npu's trainer on NPU as well
    "megatron_training.context_parallel_algo": "megatron_cp_algo",
    "actor_config.context_parallel_algo": "megatron_cp_algo",
    "megatron_training.attention_mask_type": "causal",
    "actor_config.attention_mask_type": "causal",
    "generate_config.infer_pipeline_parallel_size": 1,
    "generate_config.sampling_config.detokenize": False,
    "rl_config.blocking": True,
    "rl_config.use_integrated_worker": True,
}


class Translation:
    """The translated overrides plus a ledger of what happened to every input key."""

    def __init__(self) -> None:
        self.out: dict[str, Any] = {}
        self.mapped: list[str] = []
        self.unmapped: list[tuple[str, str]] = []
        self.notes: list[str] = []
        self.fits = True  # the chosen layout passes `asp-npu check`
        self.blocker = ""  # the layout search found no fitting split: what does not fit

    def set(self, src: str, dotted: str, value: Any) -> None:
        node = self.out
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
        if src not in self.mapped:
            self.mapped.append(src)

    def skip(self, src: str, reason: str) -> None:
        self.unmapped.append((src, reason))


def _flatten(d: dict[str, Any], prefix: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        key = f"{prefix}.{k}"
        if isinstance(v, dict) and k in ("sampling_config", "actor_resource", "critic_resource",
                                         "integrated_mode_config"):
            out += _flatten(v, key)
        else:
            out.append((key, v))
    return out


def _model_names(defaults: Any) -> list[str]:
    names: list[str] = []
    for item in defaults or []:
        if isinstance(item, dict) and "model" in item:
            m = item["model"]
            names += [str(x) for x in (m if isinstance(m, list) else [m])]
    return names


def _model_type(m: dict[str, Any], name: str) -> str:
    if m.get("multi_latent_attention"):
        return "deepseek_v3"
    if m.get("num_experts"):
        return "qwen3_moe"
    if m.get("qk_layernorm"):
        return "qwen3"
    return "llama" if name.startswith("llama") else "qwen2"


def _as_int(key: str, value: Any) -> int:
    """An integer setting of the source config, or a UserError naming the key (bools and 2.5 are not)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise UserError(f"{key}: expected an integer, got {value!r}")
    try:
        f = float(value)
    except ValueError:
        raise UserError(f"{key}: expected an integer, got {value!r}") from None
    if not math.isfinite(f) or f != int(f):
        raise UserError(f"{key}: expected an integer, got {value!r}")
    return int(f)


def _as_float(key: str, value: Any) -> float:
    """A finite number setting of the source config, or a UserError naming the key."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise UserError(f"{key}: expected a number, got {value!r}")
    try:
        f = float(value)
    except ValueError:
        raise UserError(f"{key}: expected a number, got {value!r}") from None
    if not math.isfinite(f):
        raise UserError(f"{key}: expected a finite number, got {value!r}")
    return f


def _arch_from_mindspeed_model(path: Path, name: str) -> dict[str, Any] | None:
    """configs/model/<name>.yaml (MindSpeed-RL layout, Megatron argument names) -> our model.arch keys."""
    from omegaconf import OmegaConf

    f = path / f"{name}.yaml"
    if not f.is_file():
        return None
    try:
        raw = OmegaConf.to_container(OmegaConf.load(f))
    except Exception as exc:  # YAML syntax, undecodable bytes, interpolation errors
        raise UserError(f"{f}: cannot parse YAML: {str(exc).splitlines()[0]}") from None
    m = raw.get(name, raw) if isinstance(raw, dict) else {}
    if not isinstance(m, dict) or "hidden_size" not in m:
        return None
    def num(*keys: str) -> int:  # the first key set (a YAML null counts as unset), else 0
        for k in keys:
            if m.get(k) is not None:
                return _as_int(f"{f}: {k}", m[k])
        return 0

    heads = num("num_attention_heads")
    mt = _model_type(m, name)
    arch: dict[str, Any] = dict(
        model_type=mt,
        hidden_size=num("hidden_size"),
        num_layers=num("num_layers"),
        num_attention_heads=heads,
        num_key_value_heads=num("num_query_groups") if m.get("group_query_attention") else heads,
        vocab_size=num("padded_vocab_size", "vocab_size"),
        intermediate_size=num("ffn_hidden_size"),
        max_position_embeddings=num("max_position_embeddings"),
        tie_word_embeddings=not bool(m.get("untie_embeddings_and_output_weights", False)),
        head_dim=num("kv_channels"),
    )
    if m.get("num_experts"):
        arch.update(
            num_experts=num("num_experts"),
            moe_router_topk=num("moe_router_topk"),
            moe_ffn_hidden_size=num("moe_ffn_hidden_size"),
            moe_shared_expert_intermediate_size=num("n_shared_experts")
            * num("moe_ffn_hidden_size"),
            first_k_dense_replace=num("first_k_dense_replace"),
        )
    if m.get("multi_latent_attention"):
        arch.update(
            q_lora_rank=num("q_lora_rank"),
            kv_lora_rank=num("kv_lora_rank"),
            qk_head_dim=num("qk_head_dim"),
            qk_pos_emb_head_dim=num("qk_pos_emb_head_dim"),
            v_head_dim=num("v_head_dim"),
        )
    return arch


def card_from_name(filename: str) -> str | None:
    """MindSpeed-RL names configs after the machine: grpo_qwen25_7b_A3.yaml, ..._A2.yaml."""
    m = re.search(r"(?:^|_)(A2|A3)(?:_|\.|$)", Path(filename).name, re.IGNORECASE)
    return m.group(1).lower() if m else None


def _refusal(ms: dict[str, Any]) -> str | None:
    """Why asp-npu cannot run this config at all (None = it can)."""
    for key, why in _REFUSED.items():
        top, _, leaf = key.partition(".")
        body = ms.get(top)
        if (not leaf and body) or (leaf and isinstance(body, dict) and body.get(leaf)):
            return f"{key}: {why}"
    return None


_TRAINING_SECTIONS = ("megatron_training", "actor_config")
_RL_SAME_NAME = ("n_samples_per_prompt", "adv_estimator", "kl_penalty", "max_prompt_length")
_DAPO_SAME_NAME = ("overlong_buffer_enable", "overlong_buffer", "overlong_buffer_penalty_factor",
                   "filter_groups_max_batches")
_SAMPLING_SAME_NAME = ("temperature", "top_p", "max_tokens", "top_k", "min_p")
_GEN_SAME_NAME = ("infer_tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens",
                  "gpu_memory_utilization", "max_model_len", "enforce_eager")


@dataclass
class _Found:
    """What the key walk learns besides the translation itself."""

    num_npus: int = 0  # rl_config.actor_resource.num_npus
    model_name: str | None = None


def _implied_key(tr: Translation, key: str, value: Any) -> None:
    """A MindSpeed-RL key asp-npu accepts only at the value it always implies."""
    if value == _IMPLIED_DEFAULTS[key]:
        tr.mapped.append(key)
    elif key in ("rl_config.use_integrated_worker", "rl_config.blocking"):
        tr.mapped.append(key)
        tr.notes.append(f"{key}={value}: asp-npu's mode decides colocation and blocking (rl_config.mode)")
    else:
        tr.skip(key, f"only {_IMPLIED_DEFAULTS[key]!r} is supported (got {value!r})")


_LORA_KEYS = ("lora_r", "lora_alpha", "lora_target_modules", "lora_fusion", "lora_ckpt_filter", "lora_filter")


def _lora_key(tr: Translation, key: str, leaf: str, value: Any) -> None:
    """MindSpeed-RL's grpo_lora keys (megatron_training / actor_config) -> actor_config's LoRA keys."""
    if leaf == "lora_r":
        tr.set(key, "actor_config.lora_r", _as_int(key, value))
    elif leaf == "lora_alpha":
        tr.set(key, "actor_config.lora_alpha", _as_float(key, value))
    elif leaf == "lora_target_modules":
        tr.set(key, "actor_config.lora_target_modules",
               [str(v) for v in (value if isinstance(value, list) else [value])])
    elif leaf == "lora_fusion":
        tr.mapped.append(key)
        tr.notes.append(f"{key}={value}: CCLoRA's communication overlap is an Ascend kernel option; "
                        "asp-npu's adapters give the same result unfused")
    else:  # lora_ckpt_filter / lora_filter
        tr.mapped.append(key)
        tr.notes.append(f"{key}={value}: asp-npu's LoRA checkpoints always hold only the adapters")


def _training_key(ms: dict[str, Any], tr: Translation, found: _Found, key: str, value: Any) -> bool:
    """megatron_training / actor_config keys; False = not one asp-npu maps."""
    top, leaf = key.split(".")[0], key.split(".")[-1]
    if leaf == "model":
        found.model_name = str(value)
        tr.mapped.append(key)
    elif leaf in _LORA_KEYS:
        _lora_key(tr, key, leaf, value)
    elif leaf in _DIRECT:
        if top == "megatron_training" and leaf in ms.get("actor_config", {}):
            tr.mapped.append(key)  # the actor's own value wins, as in MindSpeed-RL
            return True
        tr.set(key, _DIRECT[leaf], value)
        if leaf == "tokenizer_name_or_path":
            tr.set(key, "model.build_if_missing", False)
        if leaf == "data_path":
            tr.notes.append(f"data.data_path={value}: MindSpeed-RL's is a preprocessed Megatron-format "
                            "prefix; point it at the JSONL/Parquet file you preprocessed")
    elif leaf == "prompt_type":  # MindSpeed-RL formats every prompt with this template
        tr.set(key, "data.prompt_type", str(value))
    elif leaf == "map_keys" and isinstance(value, dict):  # MindSpeed-RL's raw dataset columns
        tr.set(key, "data.map_keys", {str(k): str(v or "") for k, v in value.items()})
    elif leaf in _LAYOUT_KEYS:
        pass  # `_layout_keys`, once the parallel sizes and the model are known
    elif leaf == "seed":
        tr.set(key, "actor_config.seed", _as_int(key, value))
        tr.set(key, "data.seed", _as_int(key, value))
    elif leaf in ("bf16", "fp16"):
        if value:
            tr.set(key, "model.dtype", "bfloat16" if leaf == "bf16" else "float16")
        else:
            tr.mapped.append(key)
    else:
        return False
    return True


def _loss_key(ms: dict[str, Any], tr: Translation, key: str, value: Any) -> bool:
    """The loss's rl_config keys (docs/loss.md); False = not one of them."""
    rl = ms.get("rl_config", {}) or {}
    if key == "rl_config.entropy_coeff":
        tr.set(key, key, _as_float(key, value))
    elif key in ("rl_config.kl_horizon", "rl_config.kl_target"):
        tr.set(key, key, _as_float(key, value))
    elif key == "rl_config.use_kl_in_reward":
        tr.set(key, key, bool(value))
    elif key == "rl_config.token_level_loss":  # MindSpeed-RL DAPO: token-mean, else seq-mean-token-mean
        tr.set(key, "rl_config.loss_agg_mode", "token-mean" if value else "seq-mean-token-mean")
    elif key == "rl_config.kl_ctrl_type":
        if value not in ("fixed", "adaptive"):
            tr.skip(key, f"only fixed or adaptive are supported (got {value!r})")
        elif value == "adaptive" and not rl.get("use_kl_in_reward"):
            tr.set(key, key, "fixed")
            tr.notes.append("rl_config.kl_ctrl_type adaptive -> fixed: MindSpeed-RL moves the coefficient "
                            "only where it applies the KL in the reward (use_kl_in_reward is false here), "
                            "so init_kl_coef stays fixed")
        else:
            tr.set(key, key, value)
    else:
        return False
    return True


def _critic_key(ms: dict[str, Any], tr: Translation, key: str, value: Any) -> bool:
    """critic_config keys (PPO's value model: asp_npu/trainer/critic.py); False = not one asp-npu maps."""
    from asp_npu.config import CriticConfig

    leaf = key.split(".")[-1]
    if leaf not in {f.name for f in fields(CriticConfig)} or leaf == "data_parallel_size":
        return False
    default = getattr(CriticConfig(), leaf)
    convert = _as_float if isinstance(default, float) else _as_int if isinstance(default, int) and not \
        isinstance(default, bool) else (lambda _k, v: v)
    tr.set(key, f"critic_config.{leaf}", convert(key, value))
    return True


def _critic_defaults(ms: dict[str, Any], tr: Translation) -> None:
    """MindSpeed-RL's critic reads megatron_training too: its distributed optimizer, sequence
    parallelism and seed."""
    if "critic_config" not in ms:
        return
    mt, cr = ms.get("megatron_training") or {}, ms.get("critic_config") or {}
    for leaf in ("use_distributed_optimizer", "sequence_parallel", "seed"):
        if mt.get(leaf) is not None and leaf not in cr:
            value = mt[leaf] if leaf != "seed" else _as_int(leaf, mt[leaf])
            tr.out.setdefault("critic_config", {})[leaf] = value


def _ppo_key(ms: dict[str, Any], tr: Translation, key: str, value: Any) -> bool:
    """GAE's rl_config keys, mapped when the config trains PPO with a critic; False = not one."""
    leaf = key.split(".")[-1]
    if leaf == "num_npus" and key.startswith("rl_config.critic_resource"):
        tr.mapped.append(key)
        tr.notes.append(f"{key}={value}: asp-npu colocates the critic with the trainer ranks (their NPUs); "
                        "critic_config.data_parallel_size 0 fills them")
        return True
    gae = (ms.get("rl_config") or {}).get("adv_estimator") == "gae"
    if gae and leaf in ("gamma", "lam", "cliprange_value"):
        tr.set(key, f"rl_config.{leaf}", _as_float(key, value))
        return True
    return False


def _rl_key(ms: dict[str, Any], tr: Translation, found: _Found, key: str, value: Any) -> bool:
    """rl_config keys; False = not one asp-npu maps."""
    if _loss_key(ms, tr, key, value) or _rl_batch_key(tr, key, value) or _ppo_key(ms, tr, key, value):
        return True
    leaf = key.split(".")[-1]
    if leaf in ("use_wandb", "use_swanlab", "wandb_project", "wandb_exp_name"):
        _logger_key(ms, tr, key, value)
    elif leaf == "num_npus":
        found.num_npus = _as_int(key, value)
        tr.mapped.append(key)
    elif key == "rl_config.adv_estimator":
        tr.set(key, key, _adv_estimator(key, value))
    elif leaf in _RL_SAME_NAME:
        tr.set(key, f"rl_config.{leaf}", value)
    elif key == "rl_config.mini_batch_size":
        _mini_batch(ms, tr, key, value)
    elif key == "rl_config.epochs":
        tr.set(key, "actor_config.ppo_epochs", _as_int(key, value))
    elif key == "rl_config.init_kl_coef":
        tr.set(key, "rl_config.kl_coef", _as_float(key, value))
    elif key == "rl_config.clip_ratio":
        tr.set(key, "rl_config.clip_ratio_low", _as_float(key, value))
        tr.set(key, "rl_config.clip_ratio_high", _as_float(key, value))
    elif leaf in _REWARD_KEYS:
        _reward_key(tr, key, value)
    elif leaf in _MULTI_TURN_KEYS:
        tr.set(key, f"multi_turn.{_MULTI_TURN_KEYS[leaf]}", value)
    elif key == "rl_config.use_tensorboard":
        _logger_key(ms, tr, key, value)
    else:
        return False
    return True


def _adv_estimator(key: str, value: Any) -> str:
    """An estimator asp-npu runs, by MindSpeed-RL's or verl's name; anything else refused in one line."""
    from asp_npu.config import ADV_ESTIMATORS, ESTIMATOR_ALIASES

    name = ESTIMATOR_ALIASES.get(str(value), str(value))
    if name not in ADV_ESTIMATORS:
        raise UserError(f"{key}: '{value}' is not an estimator asp-npu runs ({', '.join(ADV_ESTIMATORS)})")
    return name


def _rl_batch_key(tr: Translation, key: str, value: Any) -> bool:
    """rl_config's packing, clipping and DAPO keys, checked before the generic same-name ones so that
    DAPO's names win; False = not one of them."""
    leaf = key.split(".")[-1]
    if key in ("rl_config.max_packing_token_size", "rl_config.update_max_packing_token_size"):
        tr.set(key, "actor_config.ppo_max_token_len_per_gpu", _as_int(key, value))
    elif key == "rl_config.use_dynamic_bsz":
        tr.set(key, "actor_config.use_dynamic_bsz", bool(value))
    elif key == "rl_config.use_remove_padding":
        tr.set(key, "actor_config.use_remove_padding", bool(value))
    elif key in ("rl_config.clip_ratio_low", "rl_config.clip_ratio_high"):
        tr.set(key, key, _as_float(key, value))
    elif key == "rl_config.filter_groups_enable":
        tr.set(key, "rl_config.drop_equal_reward_groups", bool(value))
    elif key == "rl_config.filter_groups_metric":  # a verifier's name: its own score decides (as there)
        tr.set(key, key, str(value))
    elif leaf in _DAPO_SAME_NAME:
        tr.set(key, f"rl_config.{leaf}", value)
    else:
        return False
    return True


# MindSpeed-RL rl_config multi-turn keys -> the `multi_turn` section (asp_npu.rollout.multi_turn)
_MULTI_TURN_KEYS = {"multi_turn_enable": "enable", "tool_config_path": "tool_config_path",
                    "max_tool_calls": "max_tool_calls", "max_parallel_calls": "max_parallel_calls",
                    "max_total_response_length": "max_total_response_length",
                    "max_tool_response_length": "max_tool_response_length",
                    "tool_response_truncate_side": "tool_response_truncate_side",
                    "tool_parser_format": "format"}
# verl actor_rollout_ref.rollout.multi_turn keys -> the `multi_turn` section
_VERL_MULTI_TURN_KEYS = {"enable": "enable", "max_assistant_turns": "max_assistant_turns",
                         "max_user_turns": "max_tool_calls", "tool_config_path": "tool_config_path",
                         "format": "format", "max_parallel_calls": "max_parallel_calls",
                         "max_tool_response_length": "max_tool_response_length",
                         "tool_response_truncate_side": "tool_response_truncate_side"}


def translate_verl_multi_turn(mt: dict[str, Any],
                              prefix: str = "actor_rollout_ref.rollout.multi_turn") -> Translation:
    """verl's multi-turn rollout keys -> asp-npu's `multi_turn` section + ledger (a tool turn answers
    every call of the assistant turn before it, so verl's user turns are asp-npu's tool calls)."""
    tr = Translation()
    for leaf, value in mt.items():
        key = f"{prefix}.{leaf}"
        if value is None:
            tr.skip(key, "empty (null) in the file: left at asp-npu's default")
        elif leaf in _VERL_MULTI_TURN_KEYS:
            tr.set(key, f"multi_turn.{_VERL_MULTI_TURN_KEYS[leaf]}", value)
        elif leaf == "interaction_config_path":
            tr.skip(key, "interaction agents (simulated users) are not supported: tools only")
        else:
            tr.skip(key, "no asp-npu equivalent")
    return tr


_REWARD_KEYS = ("rule_reward", "verifier_function", "verifier_weight", "verifier_parallel",
                "verifier_timeout")


def _reward_key(tr: Translation, key: str, value: Any) -> None:
    """MindSpeed-RL's rule-reward keys -> the `reward` section (asp_npu.data.rewards)."""
    leaf = key.split(".")[-1]
    if leaf == "rule_reward":
        if value:
            tr.mapped.append(key)
        else:
            tr.skip(key, "reward models are not supported: asp-npu scores with rule verifiers only")
    elif leaf in ("verifier_function", "verifier_weight"):
        items = value if isinstance(value, list) else [value]
        tr.set(key, f"reward.{leaf}", [str(v) for v in items] if leaf == "verifier_function"
               else [_as_float(key, v) for v in items])
    elif leaf == "verifier_parallel":
        tr.set(key, "reward.verifier_parallel", _as_int(key, value))
    else:
        tr.set(key, "reward.verifier_timeout", _as_float(key, value))


def _reward_defaults(ms: dict[str, Any], tr: Translation) -> None:
    """MindSpeed-RL scores with `base_acc` when a config names no verifier: so does the import."""
    rl = ms.get("rl_config") or {}
    if "verifier_function" not in rl:
        tr.out.setdefault("reward", {})["verifier_function"] = ["base_acc"]
        tr.notes.append("reward.verifier_function: [base_acc], MindSpeed-RL's default (the config "
                        "names none)")


def _filter_metric_default(ms: dict[str, Any], tr: Translation) -> None:
    """Dynamic sampling without `filter_groups_metric` filters on MindSpeed-RL's default, the `acc`
    verifier's score; MindSpeed-RL refuses a config whose verifiers lack it, asp-npu keeps its reward."""
    rl = ms.get("rl_config") or {}
    if not rl.get("filter_groups_enable") or rl.get("filter_groups_metric") is not None:
        return
    if "acc" in tr.out.get("reward", {}).get("verifier_function", []):
        tr.out["rl_config"]["filter_groups_metric"] = "acc"
        tr.notes.append("rl_config.filter_groups_metric: acc, MindSpeed-RL's default (the file names none)")
    else:
        tr.notes.append("rl_config.filter_groups_metric: not in the file, and MindSpeed-RL's default 'acc' "
                        "is not one of its verifiers (MindSpeed-RL refuses that); asp-npu filters on the "
                        "reward")


def translate_verl_reward(cfg: dict[str, Any]) -> Translation:
    """verl's reward keys (`custom_reward_function`, `reward_model`) -> asp-npu's `reward` section + ledger.

    verl calls `custom_reward_function.name` from `.path` for every sample (asp-npu:
    `reward.custom_function`, verifier `custom`); every `reward_model.reward_manager` that scores one sample
    at a time by rule (naive, prime, batch, dapo) gives the same per-sample scores as asp-npu's verifier
    pool; a reward model is refused."""
    tr = Translation()
    custom = cfg.get("custom_reward_function") or {}
    if custom.get("path"):
        name = str(custom.get("name") or "compute_score")
        tr.set("custom_reward_function.path", "reward.custom_function", f"{custom['path']}:{name}")
        tr.mapped.append("custom_reward_function.name")
    if custom.get("reward_kwargs"):
        tr.skip("custom_reward_function.reward_kwargs", "asp-npu calls the custom function without extra "
                "keyword arguments: give them defaults in the function")
    rm = cfg.get("reward_model") or {}
    manager = rm.get("reward_manager")
    if isinstance(manager, dict):  # newer verl: reward_manager: {name: naive, ...}
        manager = manager.get("name")
    if manager in ("naive", "prime", "batch", "dapo"):
        tr.mapped.append("reward_model.reward_manager")
        if manager == "dapo":
            tr.notes.append("reward_model.reward_manager dapo: its overlong penalty comes from the DAPO "
                            "overlong_buffer settings")
    elif manager:
        tr.skip("reward_model.reward_manager", f"reward manager '{manager}' is not one asp-npu reproduces "
                "(naive, prime, batch, dapo)")
    if rm.get("enable"):
        tr.skip("reward_model.enable", "reward models are not supported: asp-npu scores with rule verifiers")
    return tr


def _logger_key(ms: dict[str, Any], tr: Translation, key: str, value: Any) -> None:
    """MindSpeed-RL's use_tensorboard / use_wandb / use_swanlab add or remove a logger; wandb_project /
    wandb_exp_name name the run."""
    leaf = key.split(".")[-1]
    if leaf == "wandb_project":
        tr.set(key, "trainer.project_name", str(value))
    elif leaf == "wandb_exp_name":
        tr.set(key, "trainer.experiment_name", str(value))
    else:
        loggers = tr.out.get("trainer", {}).get("logger") or ["console", "jsonl", "tensorboard"]
        name = leaf[len("use_"):]
        tr.set(key, "trainer.logger", [*[x for x in loggers if x != name], *([name] * bool(value))])


def _mini_batch(ms: dict[str, Any], tr: Translation, key: str, value: Any) -> None:
    """MindSpeed-RL counts a minibatch in prompts, asp-npu in samples (at most one iteration's)."""
    n = _as_int("rl_config.n_samples_per_prompt", ms.get("rl_config", {}).get("n_samples_per_prompt", 8) or 8)
    prompts = _as_int(key, value)
    gbs = _as_int("megatron_training.global_batch_size",
                  ms.get("megatron_training", {}).get("global_batch_size", 0) or 0)
    if gbs and prompts > gbs:
        tr.notes.append(f"rl_config.mini_batch_size {prompts} > global_batch_size {gbs} prompts: one "
                        f"iteration holds only {gbs}, so a minibatch is the whole iteration")
        prompts = gbs
    tr.set(key, "rl_config.mini_batch_size", prompts * n)
    tr.notes.append(f"rl_config.mini_batch_size: {prompts} prompts (MindSpeed-RL) = {prompts * n} "
                    "samples (asp-npu counts samples)")


def _generate_key(ms: dict[str, Any], tr: Translation, colocated: bool, key: str, value: Any) -> bool:
    """generate_config keys; False = not one asp-npu maps."""
    leaf = key.split(".")[-1]
    gen_in = ms.get("generate_config", {}) or {}
    if leaf.startswith("offload_train_") and colocated:
        tr.set(key, f"actor_config.{leaf}", bool(value))
    elif key == "generate_config.infer_expert_parallel_size":
        # MindSpeed-RL's expert-parallel group is infer TP x infer EP ranks (vLLM TP x DP):
        # experts split over all of them (its vllm_parallel_state / sync_model_weights)
        iep = _as_int(key, value)
        itp = _as_int("generate_config.infer_tensor_parallel_size",
                      gen_in.get("infer_tensor_parallel_size", 1) or 1)
        group = iep * itp if gen_in.get("enable_expert_parallel", iep > 1) and iep > 1 else 1
        tr.set(key, "generate_config.infer_expert_parallel_size", group)
        if group > 1:
            tr.notes.append(f"{key} {iep} x infer_tensor_parallel_size {itp}: one rollout instance "
                            f"is an expert-parallel group of {group} NPUs (experts over all of them)")
    elif key == "generate_config.enable_expert_parallel":
        tr.mapped.append(key)  # with infer_expert_parallel_size above
    elif leaf in _GEN_SAME_NAME:
        tr.set(key, f"generate_config.{leaf}", value)
    elif key == "generate_config.dtype":
        tr.set(key, "model.dtype", str(value))
    elif key.startswith("generate_config.sampling_config.") and leaf in _SAMPLING_SAME_NAME:
        tr.set(key, f"generate_config.sampling_config.{leaf}", value)
    elif key == "generate_config.sampling_config.logprobs":
        tr.set(key, "generate_config.sampling_config.logprobs", 0)
        tr.notes.append("sampling_config.logprobs: asp-npu always records the sampled token's logprob "
                        "(logprobs: 0)")
    else:
        return False
    return True


_CRITIC_REASONS = {
    "model": "the critic is the policy's model (model.path) with a value head",
    **dict.fromkeys(("finetune", "load", "save", "no_load_optim", "no_load_rng"),
                    "the critic starts from model.path's HF weights (value head zero-initialised), as "
                    "MindSpeed-RL's critic starts from the base model; it is checkpointed with the policy "
                    "(critic/ in each checkpoint) and resumed by actor_config.load"),
}
_SECTIONS = {
    "megatron_training": _TRAINING_REASONS,
    "actor_config": _TRAINING_REASONS,
    "critic_config": _CRITIC_REASONS,
    "rl_config": _RL_REASONS,
    "generate_config": _GEN_REASONS,
}


def _translate_keys(ms: dict[str, Any], tr: Translation, mode: str) -> tuple[int, str | None]:
    """Map every key; returns (actor_resource.num_npus or 0, model name)."""
    found = _Found()
    colocated = mode in COLOCATED_MODES
    for top, body in ms.items():
        if top == "defaults":
            continue
        if top not in _SECTIONS or not isinstance(body, dict):
            tr.skip(top, "section unknown to asp-npu (MindSpeed-RL GRPO uses megatron_training, "
                         "actor_config, rl_config, generate_config)")
            continue
        for key, value in _flatten(body, top):
            if value is None:
                tr.skip(key, "empty (null) in the file: left at asp-npu's default")
            elif key in _IMPLIED_DEFAULTS:
                _implied_key(tr, key, value)
            elif not (_training_key(ms, tr, found, key, value) if top in _TRAINING_SECTIONS
                      else _critic_key(ms, tr, key, value) if top == "critic_config"
                      else _rl_key(ms, tr, found, key, value) if top == "rl_config"
                      else _generate_key(ms, tr, colocated, key, value)):
                tr.skip(key, _SECTIONS[top].get(key.split(".")[-1]) or "no asp-npu equivalent")
    return found.num_npus, found.model_name


_LAYOUT_KEYS = ("moe_tp_extend_ep", "num_layer_list", "noop_layers", "num_layers", "context_parallel_size",
                "swap_optimizer")
_SWAP = (
    "MindSpeed's swap_optimizer keeps the distributed optimizer's fp32 master weights and Adam moments "
    "(12 bytes/param) in host memory and swaps 1/swap_optimizer_times of them onto the NPU at a time for "
    "the step"
)


def _layout_value(ms: dict[str, Any], leaf: str) -> tuple[str, Any]:
    """(source key, value) of a trainer setting: actor_config wins over megatron_training."""
    for top in ("actor_config", "megatron_training"):
        body = ms.get(top)
        if isinstance(body, dict) and body.get(leaf) is not None:
            return f"{top}.{leaf}", body[leaf]
    return "", None


def _int_list(key: str, value: Any) -> list[int]:
    """MindSpeed writes layer lists as "9,10,11" (or a YAML list)."""
    items = value if isinstance(value, list) else str(value).split(",")
    return [_as_int(key, str(v).strip()) for v in items if str(v).strip()]


def _layout_keys(ms: dict[str, Any], tr: Translation, model_layers: int, colocated: bool) -> None:
    """MindSpeed's layout keys in megatron-core's terms (`model_layers`: the model's own layer count).

    - moe_tp_extend_ep: experts split over TP x EP, each whole -> megatron EP = TP x EP, expert TP 1;
    - num_layer_list: layers per pipeline stage -> actor_config.num_layer_list;
    - noop_layers + num_layers: MindSpeed pads the model to num_layers with no-op layers at those global
      indices and splits evenly; the real layers per stage are the same uneven num_layer_list;
    - context_parallel_size -> actor_config.context_parallel_size (NPU: MindSpeed's attention);
    - swap_optimizer -> optimizer_cpu_offload at fraction 1.0 (megatron-core's HybridDeviceOptimizer):
      the state lives and is stepped in host memory, in every mode."""
    act = tr.out.get("actor_config", {})
    tp = _as_int("tensor_model_parallel_size", act.get("tensor_model_parallel_size", 1))
    pp = _as_int("pipeline_model_parallel_size", act.get("pipeline_model_parallel_size", 1))
    seen = {leaf: _layout_value(ms, leaf) for leaf in _LAYOUT_KEYS}
    _shadowed_layout_keys(ms, tr, seen)
    _moe_tp_extend_ep(tr, seen, act, tp)
    _swap_cp_and_stages(tr, seen)
    _noop_layers(tr, seen, model_layers, pp)


def _shadowed_layout_keys(ms: dict[str, Any], tr: Translation, seen: dict[str, tuple[str, Any]]) -> None:
    """megatron_training copies that actor_config overrides count as mapped: the ledger stays complete."""
    for top in ("megatron_training", "actor_config"):
        for leaf in _LAYOUT_KEYS:
            key = f"{top}.{leaf}"
            if isinstance(ms.get(top), dict) and leaf in ms[top] and key != seen[leaf][0]:
                tr.mapped.append(key)


def _moe_tp_extend_ep(tr: Translation, seen: dict[str, tuple[str, Any]], act: dict[str, Any],
                      tp: int) -> None:
    """MindSpeed's experts over TP x EP, each whole, are megatron-core's EP = TP x EP with expert TP 1."""
    key, extend = seen["moe_tp_extend_ep"]
    if key and extend:
        ep = _as_int("expert_model_parallel_size", act.get("expert_model_parallel_size", 1))
        tr.set(key, "actor_config.expert_model_parallel_size", ep * tp)
        tr.set(key, "actor_config.expert_tensor_parallel_size", 1)
        tr.notes.append(f"{key}: experts over TP{tp} x EP{ep}, each whole = megatron-core expert_model_"
                        f"parallel_size {ep * tp} with expert_tensor_parallel_size 1")
    elif key:
        tr.mapped.append(key)


def _swap_cp_and_stages(tr: Translation, seen: dict[str, tuple[str, Any]]) -> None:
    """swap_optimizer, context_parallel_size and num_layer_list: keys with a direct megatron-core twin."""
    key, swap = seen["swap_optimizer"]
    if key and swap:
        _swap_optimizer(tr, key)
        tr.set(key, "actor_config.use_distributed_optimizer", True)  # HybridDeviceOptimizer needs it
    elif key:
        tr.mapped.append(key)
    key, cp = seen["context_parallel_size"]
    if key:
        tr.set(key, "actor_config.context_parallel_size", _as_int(key, cp))
    key, layer_list = seen["num_layer_list"]
    if key:
        tr.set(key, "actor_config.num_layer_list", _int_list(key, layer_list))


def _noop_layers(tr: Translation, seen: dict[str, tuple[str, Any]], model_layers: int, pp: int) -> None:
    """noop_layers + num_layers -> the real layers per stage (num_layer_list); megatron-core has no
    no-op layers, so the padded model's even split becomes an uneven one of the real layers."""
    noop_key, noop = seen["noop_layers"]
    layers_key, padded = seen["num_layers"]
    if not noop_key:
        if layers_key and model_layers and _as_int(layers_key, padded) == model_layers:
            tr.mapped.append(layers_key)
        elif layers_key:
            tr.skip(layers_key, f"the model's own layer count ({model_layers or 'config.json'}) is used")
        return
    padded_n = _as_int(layers_key, padded) if layers_key else model_layers
    holes = sorted(set(_int_list(noop_key, noop)))
    why = _noop_problem(padded_n, holes, model_layers, pp)
    if why:
        tr.skip(noop_key, why)
        if layers_key:
            tr.skip(layers_key, why)
        return
    per = padded_n // pp
    stages = [per - sum(1 for h in holes if s * per <= h < (s + 1) * per) for s in range(pp)]
    tr.set(noop_key, "actor_config.num_layer_list", stages)
    if layers_key:
        tr.mapped.append(layers_key)
    tr.notes.append(f"{noop_key} {holes} in {padded_n} padded layers over PP{pp}: stages of "
                    f"{'+'.join(map(str, stages))} real layers (actor_config.num_layer_list)")


def _noop_problem(padded_n: int, holes: list[int], model_layers: int, pp: int) -> str:
    """Why the no-op layers cannot be turned into stages ("" if they can)."""
    if not padded_n or padded_n % pp:
        return f"num_layers {padded_n} does not split evenly over PP{pp}"
    if holes and not 0 <= holes[0] <= holes[-1] < padded_n:
        return f"no-op layer indices {holes} are outside 0..{padded_n - 1}"
    if model_layers and padded_n - len(holes) != model_layers:
        return f"{padded_n} - {len(holes)} no-op layers != the model's {model_layers} layers"
    return ""


def _swap_optimizer(tr: Translation, key: str) -> None:
    """swap_optimizer -> megatron-core's host-resident optimizer (HybridDeviceOptimizer) at fraction 1.0
    in every mode; it replaces offload_train_optimizer, whose state is then on the host already."""
    act = tr.out.setdefault("actor_config", {})
    tr.set(key, "actor_config.optimizer_cpu_offload", True)
    tr.set(key, "actor_config.optimizer_offload_fraction", 1.0)
    tr.notes.append(f"{key}: {_SWAP}; asp-npu keeps all of it in host memory and steps it there "
                    "(actor_config.optimizer_cpu_offload, megatron-core's HybridDeviceOptimizer)")
    if act.pop("offload_train_optimizer", False):
        tr.notes.append("generate_config.offload_train_optimizer: dropped, the optimizer state lives in host "
                        "memory already (optimizer_cpu_offload)")


def _optimizer_defaults(ms: dict[str, Any], tr: Translation) -> None:
    """Optimizer keys the file leaves out take MindSpeed-RL's defaults, not asp-npu's."""
    for leaf, value in _MINDSPEED_OPTIM_DEFAULTS.items():
        if not any(isinstance(ms.get(t), dict) and ms[t].get(leaf) is not None for t in _TRAINING_SECTIONS):
            tr.out.setdefault("actor_config", {})[leaf] = value
            tr.notes.append(f"actor_config.{leaf}: not in the file; MindSpeed-RL's default {value!r}")


def _passes(trial: Config, nodes: int, per_node: int, card: Card) -> bool:
    """What `asp-npu check` would say (the model folder lives on the cluster, not here)."""
    trial.model.build_if_missing = True
    from asp_npu.deploy.search import layout_problems

    return not (layout_problems(trial) or plan_layout(trial, nodes, per_node, card).problems)


def _choose_layout(base: Config, total: int, card_name: str, mode: str, tr: Translation) -> None:
    """Split `total` NPUs between rollout instances and the trainer (or colocate them); `tr.fits` says
    whether the chosen layout passes `asp-npu check`."""
    k = instance_npus(base)
    card = card_for(card_name)
    per_node = min(card.npus_per_node, total)
    nodes = math.ceil(total / per_node)
    if mode in COLOCATED_MODES:
        replica = _replica(base)
        choice = (max(1, total // k), max(1, total // replica))
        trial = copy.deepcopy(base)
        trial.rl_config.mode = mode
        trial.generate_config.num_instances, trial.actor_config.data_parallel_size = choice
        tr.fits = _passes(trial, nodes, per_node, card)
    elif _searched(base, nodes, per_node, card, mode, tr):
        return
    else:
        choice = _balanced_split(base, total, nodes, per_node, card, mode, tr)
    tr.out.setdefault("generate_config", {})["num_instances"] = choice[0]
    tr.out.setdefault("actor_config", {})["data_parallel_size"] = choice[1]
    tr.out.setdefault("rl_config", {})["mode"] = mode
    tr.out["trainer"] = {
        **tr.out.get("trainer", {}),
        "device": "npu",
        "nnodes": nodes,
        "n_devices_per_node": per_node,
        "card": card.name,
    }
    tr.notes.append(
        f"layout: {total} NPUs ({nodes} x {per_node} {card.name}) -> {choice[0]} rollout instances x "
        f"{k} NPUs (TP{base.generate_config.infer_tensor_parallel_size}) + trainer {_trainer_shape(base)} "
        f"x DP{choice[1]}"
        + (" (colocated)" if mode in COLOCATED_MODES else "")
    )


def _replica(base: Config) -> int:
    """Trainer ranks per data-parallel rank: the unit the trainer's NPUs come in."""
    act = base.actor_config
    return act.tensor_model_parallel_size * act.pipeline_model_parallel_size * act.context_parallel_size


def _trainer_shape(base: Config) -> str:
    """The trainer's model-parallel sizes as the notes and errors show them (CP only where used)."""
    act = base.actor_config
    cp = f" x CP{act.context_parallel_size}" if act.context_parallel_size > 1 else ""
    return f"TP{act.tensor_model_parallel_size} x PP{act.pipeline_model_parallel_size}{cp}"


def _balanced_split(base: Config, total: int, nodes: int, per_node: int, card: Card, mode: str,
                    tr: Translation) -> tuple[int, int]:
    """(instances, trainer DP) when the layout search finds nothing: a passing split first, then the one
    closest to half the NPUs for the trainer, then the most instances; noted when none passes."""
    replica, k = _replica(base), instance_npus(base)
    candidates = []
    for dp in range(1, total // replica + 1):
        instances = (total - replica * dp) // k
        if instances < 1:
            break
        trial = copy.deepcopy(base)
        trial.rl_config.mode = mode
        trial.actor_config.data_parallel_size = dp
        trial.generate_config.num_instances = instances
        ok = _passes(trial, nodes, per_node, card)
        candidates.append((not ok, abs(replica * dp - total / 2), -instances, instances, dp))
    if not candidates:
        raise UserError(
            f"actor_resource.num_npus={total} cannot hold a trainer ({_trainer_shape(base)}) plus one "
            f"rollout instance ({k} NPUs); use --mode mindspeed-sync or more NPUs"
        )
    candidates.sort()
    bad, _, _, instances, dp = candidates[0]
    tr.fits = not bad
    if bad:
        tr.notes.append(
            "no split of the NPUs passes `asp-npu check`; kept the most balanced one -- run the "
            "check to see what to change"
        )
    return instances, dp


def _searched(base: Config, nodes: int, per_node: int, card: Card, mode: str, tr: Translation) -> bool:
    """The layout search's best fitting split written into `tr` (False: none fits; its reason noted)."""
    from asp_npu.deploy.search import format_result, search

    trial = copy.deepcopy(base)
    trial.rl_config.mode = mode
    res = search(trial, nodes, per_node, card)
    if not res.ranked:
        tr.blocker = res.blocker
        return False
    best = res.ranked[0]
    act, gen = best.cfg.actor_config, best.cfg.generate_config
    out_act, out_gen = tr.out.setdefault("actor_config", {}), tr.out.setdefault("generate_config", {})
    for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
              "data_parallel_size", "sequence_parallel", "recompute_granularity", "recompute_method",
              "recompute_num_layers", "use_distributed_optimizer", "optimizer_cpu_offload",
              "optimizer_offload_fraction"):
        out_act[k] = getattr(act, k)
    out_act["num_layer_list"] = list(act.num_layer_list)
    out_gen["num_instances"] = gen.num_instances
    out_gen["infer_tensor_parallel_size"] = gen.infer_tensor_parallel_size
    tr.out.setdefault("rl_config", {}).update(mode=mode, max_lag=best.cfg.rl_config.max_lag)
    tr.out["trainer"] = {**tr.out.get("trainer", {}), "device": "npu", "nnodes": nodes,
                         "n_devices_per_node": per_node, "card": card.name}
    tr.notes += format_result(res, shown=3)
    tr.notes.append(f"layout: {nodes * per_node} NPUs ({nodes} x {per_node} {card.name}) -> "
                    f"{best.cand.describe()}")
    return True


def translate(ms: dict[str, Any], source: Path, card: str | None = None, mode: str = "asp") -> Translation:
    """MindSpeed-RL GRPO config (parsed YAML) -> Translation (our overrides + ledger)."""
    _check_importable(ms, source)
    tr = Translation()
    try:
        num_npus, model_name = _translate_keys(ms, tr, mode)
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None
    _optimizer_defaults(ms, tr)
    _reward_defaults(ms, tr)
    _filter_metric_default(ms, tr)
    _critic_defaults(ms, tr)
    names = ([model_name] if model_name else []) + _model_names(ms.get("defaults"))
    arch = _find_arch(names, source, tr)
    try:
        _layout_keys(ms, tr, int(arch.get("num_layers", 0)) if arch else 0, mode in COLOCATED_MODES)
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None
    if arch:
        tr.out.setdefault("model", {})["arch"] = dict(arch)
    elif names:
        tr.notes.append(
            f"model '{names[0]}': architecture unknown; asp-npu check will read model.path/config.json"
        )
    tr.out.setdefault("rl_config", {}).setdefault("max_lag", 0 if mode in COLOCATED_MODES else 2)
    _loss_defaults(ms, tr, source)
    truncation_defaults(tr, (ms.get("generate_config", {}) or {}).get("sampling_config", {}) or {},
                        "generate_config.sampling_config", "MindSpeed-RL", cuts=("top_k", "min_p"))
    _rollout_memory(ms, tr, source, mode)
    if num_npus:
        _layout(ms, tr, source, card, mode, num_npus)
    else:
        tr.notes.append("rl_config.actor_resource.num_npus missing: layout left at asp-npu defaults")
    return tr


def _check_importable(ms: Any, source: Path) -> None:
    """Refuse a file that is not a MindSpeed-RL GRPO config, or one asp-npu cannot train, before any
    translation, so nothing half-translated is written."""
    if not isinstance(ms, dict) or not {"actor_config", "rl_config", "generate_config"} & set(ms):
        raise UserError(
            f"{source}: not a MindSpeed-RL GRPO config (no actor_config / rl_config / generate_config)"
        )
    for section in ("megatron_training", "actor_config", "rl_config", "generate_config"):
        if ms.get(section) is not None and not isinstance(ms[section], dict):
            raise UserError(f"{source}: {section}: expected a mapping, got {type(ms[section]).__name__}")
    refused = _refusal(ms)
    if refused:
        raise UserError(f"{source}: cannot import: {refused}")


def _find_arch(names: list[str], source: Path, tr: Translation) -> dict[str, Any] | None:
    """The model's architecture: MindSpeed-RL's model YAML next to the file wins over asp-npu's table,
    so a user's own model definition is the one checked."""
    arch = None
    for name in names:
        for folder in (source.parent / "model", source.parent.parent / "configs" / "model"):
            arch = _arch_from_mindspeed_model(folder, name)
            if arch:
                tr.notes.append(f"model.arch from {folder / (name + '.yaml')}")
                break
        if arch is None and name in KNOWN_MODELS:
            arch = KNOWN_MODELS[name]
            tr.notes.append(f"model.arch from asp-npu's table for {name}")
        if arch:
            break
    act = tr.out.get("actor_config", {})
    if arch and arch.get("num_experts") and act.get("use_remove_padding"):
        act["use_remove_padding"] = False  # packing changes speed, never the result
        tr.notes.append("rl_config.use_remove_padding: asp-npu packs dense models only; this MoE model "
                        "trains on padded micro-batches (same log-probs and gradients, more compute)")
    return arch


def _rollout_memory(ms: dict[str, Any], tr: Translation, source: Path, mode: str) -> None:
    """Disaggregated rollout NPUs hold no trainer state, so a colocated file's low KV-cache share rises."""
    gen_in = ms.get("generate_config", {})
    if (
        mode not in COLOCATED_MODES
        and "gpu_memory_utilization" in gen_in
        and _as_float(f"{source}: generate_config.gpu_memory_utilization",
                      gen_in["gpu_memory_utilization"]) < 0.9
    ):
        tr.out.setdefault("generate_config", {})["gpu_memory_utilization"] = 0.9
        tr.notes.append(
            f"generate_config.gpu_memory_utilization {gen_in['gpu_memory_utilization']} -> 0.9: in mode "
            f"{mode} rollout NPUs are not shared with training, so the KV cache may take the rest"
        )


def _layout(ms: dict[str, Any], tr: Translation, source: Path, card: str | None, mode: str,
            num_npus: int) -> None:
    """Place the file's NPUs; when no disaggregated split fits but colocating would, say so rather than
    write a config that fails `asp-npu check`."""
    card_name = card or card_from_name(str(source)) or "910b"
    base = _as_config(tr.out)
    bad = range_problems(base)  # zero parallel sizes would divide by zero in the layout search
    if bad:
        raise UserError(f"{source}: translated {bad[0]}")
    no_split: UserError | None = None
    try:
        _choose_layout(base, num_npus, card_name, mode, tr)
    except UserError as exc:
        no_split, tr.fits = exc, False
    if tr.fits or mode in COLOCATED_MODES:
        return
    try:
        colocated: Translation | None = translate(ms, source, card, "mindspeed-sync")
    except UserError:
        colocated = None
    if colocated is not None and colocated.fits:
        raise UserError(
            f"{source}: no split of its {num_npus} NPUs between rollout instances and the trainer "
            f"passes `asp-npu check` in mode {mode}"
            + (f" (smallest footprint: {tr.blocker})" if tr.blocker else "")
            + "; --mode mindspeed-sync fits (rollout and "
            "training take turns on every NPU, as MindSpeed-RL runs it)"
        )
    if no_split is not None and tr.blocker:  # the search tried every split: its reason, not the file's shape
        raise UserError(f"{source}: no split of its {num_npus} NPUs between rollout instances and the "
                        f"trainer passes `asp-npu check` in mode {mode} (smallest footprint: {tr.blocker}); "
                        "--mode mindspeed-sync does not pass either")
    if no_split is not None:
        raise no_split


def _loss_defaults(ms: dict[str, Any], tr: Translation, source: Path) -> None:
    """What MindSpeed-RL's loss lacks: no dual clip (clip_ratio_c 0); its old log-probs are the
    trainer's own, so with nucleus sampling it has no behaviour-policy weight (importance_cap 0)."""
    tr.out.setdefault("rl_config", {})["clip_ratio_c"] = 0.0
    tr.notes.append("rl_config.clip_ratio_c 0: MindSpeed-RL's GRPO loss has no dual clip")
    sampling = (ms.get("generate_config", {}) or {}).get("sampling_config", {}) or {}
    if "top_p" in sampling and _as_float(f"{source}: generate_config.sampling_config.top_p",
                                         sampling["top_p"]) < 1:
        tr.out["rl_config"]["importance_cap"] = 0.0
        tr.notes.append(f"rl_config.importance_cap 0: top_p {sampling['top_p']} < 1 makes the rollout's "
                        "logprobs those of the truncated distribution; MindSpeed-RL recomputes them with the "
                        "trainer and has no behaviour-policy correction")


def truncation_defaults(tr: Translation, sampling: dict[str, Any], prefix: str, peer: str,
                        cuts: tuple[str, ...] = ("top_p", "top_k", "min_p")) -> None:
    """Truncated sampling (top_p < 1, top_k > 0, min_p > 0): the rollout's logprobs are those of the
    truncated distribution (`config.truncation_problems`); the peer recomputes old logprobs with its
    trainer and has no behaviour-policy correction, so neither has the import (importance_cap 0)."""
    active = {"top_p": lambda v: v < 1, "top_k": lambda v: v > 0, "min_p": lambda v: v > 0}
    on = [f"{k} {sampling[k]}" for k in cuts if sampling.get(k) is not None
          and active[k](_as_float(f"{prefix}.{k}", sampling[k]))]
    if on:
        tr.out.setdefault("rl_config", {})["importance_cap"] = 0.0
        tr.notes.append(f"rl_config.importance_cap 0: {', '.join(on)} truncate the sampled distribution, so "
                        f"the rollout's logprobs are of the truncated one; {peer} recomputes them with the "
                        "trainer and has no behaviour-policy correction")


def _as_config(out: dict[str, Any]) -> Config:
    from omegaconf import OmegaConf

    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(out))
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except Exception as exc:
        key = getattr(exc, "full_key", "") or ""
        where = f" at {key}" if key else ""
        raise UserError(f"translated config is not valid{where}: {str(exc).splitlines()[0]}") from None


def render_yaml(tr: Translation, source: Path) -> str:
    from omegaconf import OmegaConf

    head = [
        f"# Translated from MindSpeed-RL config {source} by `asp-npu import-config mindspeed-rl`.",
        "# Check it for your cluster before queueing:  asp-npu check --config <this file>",
    ]
    head += [f"# note: {n}" for n in tr.notes]
    if tr.unmapped:
        head.append(f"# could not map {len(tr.unmapped)} key(s):")
        head += [f"#   {k}: {why}" for k, why in tr.unmapped]
    return "\n".join(head) + "\n" + OmegaConf.to_yaml(OmegaConf.create(tr.out))


# ------------------------------------------------------------------ verl's actor optimizer keys
_VERL_STYLES = {"constant": "constant", "cosine": "cosine", "linear": "linear"}


def _verl_style(key: str, value: Any) -> str:
    style = _VERL_STYLES.get(str(value))
    if style is None:
        raise UserError(f"{key}: '{value}' is not one of {', '.join(_VERL_STYLES)}")
    return style


def _verl_optim_key(tr: Translation, key: str, leaf: str, value: Any, lr: float) -> bool:
    """One key of verl's `actor.optim` (FSDP or Megatron actor); False = not one asp-npu maps."""
    if leaf == "lr":
        tr.set(key, "actor_config.lr", lr)
    elif leaf in ("warmup_style", "lr_scheduler_type", "lr_decay_style"):
        tr.set(key, "actor_config.lr_decay_style", _verl_style(key, value))
    elif leaf == "lr_warmup_steps_ratio":
        tr.set(key, "actor_config.lr_warmup_fraction", _as_float(key, value))
    elif leaf == "lr_warmup_steps":  # -1 (verl's default) = use the ratio
        if _as_int(key, value) > 0:
            tr.set(key, "actor_config.lr_warmup_iters", _as_int(key, value))
        else:
            tr.mapped.append(key)
    elif leaf == "min_lr_ratio":
        tr.set(key, "actor_config.min_lr", _as_float(key, value) * lr)
    elif leaf in ("min_lr", "lr_warmup_init", "weight_decay", "clip_grad", "adam_eps"):
        tr.set(key, f"actor_config.{leaf}", _as_float(key, value))
    elif leaf == "lr_decay_steps":
        if value is not None and _as_int(key, value) > 0:
            tr.set(key, "actor_config.lr_decay_iters", _as_int(key, value))
        else:
            tr.mapped.append(key)
    elif leaf == "weight_decay_incr_style":
        tr.set(key, "actor_config.weight_decay_incr_style", str(value))
    elif leaf == "betas":
        b1, b2 = (_as_float(key, b) for b in value)
        tr.set(key, "actor_config.adam_beta1", b1)
        tr.set(key, "actor_config.adam_beta2", b2)
    elif leaf in ("total_training_steps", "num_cycles"):
        tr.mapped.append(key)  # filled in by verl's trainer from trainer.total_epochs / a 0.5 cosine
    else:
        return False
    return True


def translate_verl_actor(actor: dict[str, Any], prefix: str = "actor_rollout_ref.actor") -> Translation:
    """verl's `actor_rollout_ref.actor` optimizer and epoch keys -> asp-npu overrides + ledger.

    verl steps its scheduler once per training step (iteration) and asp-npu once per optimizer step
    over iteration-sized lengths, so warm-up and decay end at the same iterations; `lr_warmup_steps_ratio`
    is a fraction of the whole run in both (asp-npu's decay defaults to trainer.train_iters)."""
    tr = Translation()
    optim = actor.get("optim") or {}
    if not isinstance(optim, dict):
        raise UserError(f"{prefix}.optim: expected a mapping, got {type(optim).__name__}")
    lr = _as_float(f"{prefix}.optim.lr", optim.get("lr", 1e-6))
    for leaf, value in optim.items():
        key = f"{prefix}.optim.{leaf}"
        if value is None:
            tr.skip(key, "empty (null) in the file: left at asp-npu's default")
        elif not _verl_optim_key(tr, key, leaf, value, lr):
            tr.skip(key, "no asp-npu equivalent")
    if "ppo_epochs" in actor:
        tr.set(f"{prefix}.ppo_epochs", "actor_config.ppo_epochs", _as_int(f"{prefix}.ppo_epochs",
                                                                          actor["ppo_epochs"]))
    if "shuffle" in actor:
        tr.skip(f"{prefix}.shuffle", _SHUFFLE)
    if "grad_clip" in actor:
        tr.set(f"{prefix}.grad_clip", "actor_config.clip_grad", _as_float(f"{prefix}.grad_clip",
                                                                          actor["grad_clip"]))
    return tr


def _verl_targets(key: str, value: Any) -> list[str]:
    """verl's / PEFT's `target_modules` (HF names or "all-linear") -> megatron layers, in LORA_TARGETS
    order; a fused megatron layer takes the adapter when any of its HF projections is named."""
    from asp_npu.config import LORA_TARGETS

    names = [value] if isinstance(value, str) else list(value or [])
    if "all-linear" in names:
        return list(LORA_TARGETS)
    hf_to = {"q_proj": "linear_qkv", "k_proj": "linear_qkv", "v_proj": "linear_qkv", "o_proj": "linear_proj",
             "gate_proj": "linear_fc1", "up_proj": "linear_fc1", "down_proj": "linear_fc2",
             **{t: t for t in LORA_TARGETS}}
    unknown = [str(n) for n in names if n not in hf_to]
    if unknown:
        raise UserError(f"{key}: '{unknown[0]}' is not a projection LoRA applies to "
                        f"(all-linear, {', '.join(sorted(hf_to))})")
    found = {hf_to[str(n)] for n in names}
    return [t for t in LORA_TARGETS if t in found]


def translate_verl_lora(model: dict[str, Any], prefix: str = "actor_rollout_ref.model") -> Translation:
    """verl's LoRA keys (`lora_rank`, `lora_alpha`, `target_modules`) -> actor_config's LoRA keys.

    verl's `lora_rank: 0` means no LoRA; its adapters are PEFT's on q/k/v/o/gate/up/down, asp-npu's on
    megatron's fused layers (q/k/v one adapter on linear_qkv, gate/up one on linear_fc1)."""
    tr = Translation()
    rank = _as_int(f"{prefix}.lora_rank", model.get("lora_rank", 0) or 0)
    if not rank:
        for leaf in ("lora_rank", "lora_alpha", "target_modules"):
            if leaf in model:
                tr.mapped.append(f"{prefix}.{leaf}")
        return tr
    tr.set(f"{prefix}.lora_rank", "actor_config.lora_r", rank)
    tr.set(f"{prefix}.lora_alpha", "actor_config.lora_alpha",
           _as_float(f"{prefix}.lora_alpha", model.get("lora_alpha", 16)))
    targets = _verl_targets(f"{prefix}.target_modules", model.get("target_modules", "all-linear"))
    tr.set(f"{prefix}.target_modules", "actor_config.lora_target_modules", targets)
    given = model.get("target_modules")
    named = set(given) if isinstance(given, list) else {"q_proj", "k_proj", "v_proj"}
    if "linear_qkv" in targets and {"q_proj", "k_proj", "v_proj"} - named - {"linear_qkv"}:
        tr.notes.append(f"{prefix}.target_modules: q/k/v share megatron's linear_qkv, so its adapter "
                        "covers all three")
    return tr
