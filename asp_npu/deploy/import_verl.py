"""`asp-npu import-config verl FILE.yaml --out ours.yaml`: translate a verl GRPO/DAPO config into an asp-npu
config, with the same ledger as the MindSpeed-RL importer (mapped / no effect / to review) and one line,
exit 2, for a key asp-npu does not know or cannot run.

FILE is verl's own YAML (`verl/trainer/config/ppo_trainer.yaml`-shaped, nested sections) or an example's
overrides written as YAML: nested, or the command line's dotted keys (`actor_rollout_ref.rollout.n: 5`; a
Hydra `+` prefix is dropped). A key the file leaves out takes verl's default (`VERL_DEFAULTS`, the values
of verl's config for the keys whose default differs from asp-npu's or decides the translation), so an
override set imports as the run verl would start from it; only the file's own keys enter the ledger.

The rules (verl -> asp-npu):
- GRPO only (`algorithm.adv_estimator: grpo` -> group_norm); a critic, a reward model, LoRA, multi-turn
  rollouts or another policy loss are refused.
- Batches: verl counts `data.train_batch_size` and `actor.ppo_mini_batch_size` in prompts, asp-npu counts
  the minibatch in samples (x `rollout.n`); `trainer.total_training_steps` (or the training file's rows //
  train_batch_size x `total_epochs`, when the file is here) -> `trainer.train_iters`.
- KL: `actor.use_kl_loss` -> the loss's `kl_coef` / `kl_penalty` (`kl_loss_coef` / `kl_loss_type`);
  `algorithm.use_kl_in_reward` -> the reward's (`algorithm.kl_ctrl`, `algorithm.kl_penalty`).
- DAPO: `algorithm.filter_groups` -> dynamic sampling, its `metric` -> `filter_groups_metric` (verl's `acc`
  and `score` are the verifiers' score before the overlong penalty: `score`; `seq_reward` is the shaped
  reward: `reward`); `reward_model.overlong_buffer` -> the overlong shaping.
- Optimizer and reward keys: `translate_verl_actor` / `translate_verl_reward` (asp_npu.deploy.import_config).
- Parallel sizes, offload, kernels, profilers, checkpoint bookkeeping: no effect on the trained result
  (the layout search places the run, as for MindSpeed-RL).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asp_npu.config import COLOCATED_MODES, range_problems
from asp_npu.deploy import import_config as ic
from asp_npu.errors import UserError

VERL_SECTIONS = (
    "data",
    "actor_rollout_ref",
    "algorithm",
    "trainer",
    "reward_model",
    "custom_reward_function",
    "critic",
    "global_profiler",
    "transfer_queue",
    "ray_kwargs",
    "reward_manager",
    "defaults",
)
ACTOR, ROLLOUT, REF, MODEL = (
    "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.ref",
    "actor_rollout_ref.model",
)

# verl's defaults (verl/trainer/config, 2026-11) where they differ from asp-npu's or decide the translation
VERL_DEFAULTS: dict[str, Any] = {
    "algorithm.adv_estimator": "gae",
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_penalty": "kl",
    "algorithm.kl_ctrl.kl_coef": 0.001,
    f"{ACTOR}.use_kl_loss": False,
    f"{ACTOR}.kl_loss_coef": 0.001,
    f"{ACTOR}.kl_loss_type": "low_var_kl",
    f"{ACTOR}.clip_ratio": 0.2,
    f"{ACTOR}.optim.lr": 1e-6,
    f"{ACTOR}.optim.weight_decay": 0.01,
    f"{ACTOR}.ppo_mini_batch_size": 256,
    f"{ROLLOUT}.n": 1,
    f"{ROLLOUT}.tensor_model_parallel_size": 2,
    f"{ROLLOUT}.gpu_memory_utilization": 0.5,
    f"{ROLLOUT}.max_num_seqs": 256,
    f"{ROLLOUT}.dtype": "bfloat16",
    "data.train_batch_size": 1024,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "trainer.total_epochs": 30,
    "trainer.save_freq": -1,
    "trainer.test_freq": -1,
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
    "trainer.device": "cuda",
}

_NO_EFFECT_LAYOUT = "parallel split / memory placement: asp-npu's layout search places the run (same result)"
_NO_EFFECT_KERNEL = "kernel or compile switch: no effect on the trained result"
_NO_EFFECT_BOOK = (
    "run bookkeeping (profiling, checkpoint files, resume, dumps, timeouts): no effect on training"
)
_NO_EFFECT_ENGINE = "rollout engine setting: asp-npu generates with vLLM (vllm-ascend on NPU), same sampling"
_NO_EFFECT_LOGPROB = "log-prob recompute batching: memory and speed only"
_NO_EFFECT_DATA = "dataset loading detail (workers, shared memory, raw chat): the prompts are the same"
_NO_EFFECT_VAL = "validation-only setting: no effect on what is trained"

# verl key (dotted, or a prefix ending in '.') -> the reason it has no effect on the trained result
NO_EFFECT: dict[str, str] = {
    **dict.fromkeys(
        (
            f"{ACTOR}.fsdp_config.",
            f"{REF}.fsdp_config.",
            f"{ACTOR}.megatron.",
            f"{REF}.megatron.",
            f"{ACTOR}.ulysses_sequence_parallel_size",
            f"{REF}.ulysses_sequence_parallel_size",
            f"{ACTOR}.strategy",
            f"{REF}.strategy",
            f"{MODEL}.enable_gradient_checkpointing",
            f"{MODEL}.enable_activation_offload",
            f"{MODEL}.use_fused_kernels",
            "actor_rollout_ref.hybrid_engine",
            f"{ACTOR}.ppo_micro_batch_size",
            "trainer.balance_batch",
            f"{ROLLOUT}.free_cache_engine",
            f"{ROLLOUT}.layered_summon",
            f"{ROLLOUT}.load_format",
            f"{ROLLOUT}.enable_chunked_prefill",
            f"{ROLLOUT}.disable_log_stats",
            f"{ROLLOUT}.enable_prefix_caching",
            f"{ROLLOUT}.engine_kwargs.",
            f"{ROLLOUT}.update_weights_bucket_megabytes",
            f"{ROLLOUT}.expert_parallel_size",
            f"{ROLLOUT}.data_parallel_size",
            f"{ROLLOUT}.pipeline_model_parallel_size",
            f"{REF}.log_prob_use_dynamic_bsz",
            f"{REF}.log_prob_max_token_len_per_gpu",
        ),
        _NO_EFFECT_LAYOUT,
    ),
    **dict.fromkeys(
        (
            f"{ACTOR}.use_torch_compile",
            f"{REF}.use_torch_compile",
            f"{MODEL}.use_liger",
            f"{ACTOR}.entropy_from_logits_with_chunking",
            f"{ACTOR}.entropy_checkpointing",
            f"{REF}.entropy_from_logits_with_chunking",
            f"{REF}.entropy_checkpointing",
            "actor_rollout_ref.nccl_timeout",
            f"{MODEL}.use_shm",
        ),
        _NO_EFFECT_KERNEL,
    ),
    **dict.fromkeys(
        (
            "global_profiler.",
            "transfer_queue.",
            "ray_kwargs.",
            "trainer.resume_mode",
            "trainer.resume_from_path",
            "trainer.default_local_dir",
            "trainer.default_hdfs_dir",
            "trainer.del_local_ckpt_after_load",
            "trainer.max_actor_ckpt_to_keep",
            "trainer.max_critic_ckpt_to_keep",
            "trainer.ray_wait_register_center_timeout",
            "trainer.esi_redundant_time",
            "trainer.rollout_data_dir",
            "trainer.validation_data_dir",
            "trainer.log_val_generations",
            "trainer.use_legacy_worker_impl",
            "trainer.critic_warmup",
            f"{ACTOR}.checkpoint.",
            f"{ACTOR}.profiler.",
            f"{REF}.profiler.",
            f"{ROLLOUT}.profiler.",
            f"{ROLLOUT}.skip_rollout",
            f"{ROLLOUT}.skip_dump_dir",
            "reward_model.overlong_buffer.log",
            f"{ROLLOUT}.calculate_log_probs",
            "defaults",
        ),
        _NO_EFFECT_BOOK,
    ),
    **dict.fromkeys(
        (
            f"{ROLLOUT}.name",
            f"{ROLLOUT}.mode",
            f"{ROLLOUT}.skip_tokenizer_init",
            f"{ROLLOUT}.agent.num_workers",
        ),
        _NO_EFFECT_ENGINE,
    ),
    **dict.fromkeys(
        (
            f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu",
            f"{ROLLOUT}.log_prob_micro_batch_size",
            f"{REF}.log_prob_micro_batch_size_per_gpu",
            f"{REF}.log_prob_micro_batch_size",
            f"{ROLLOUT}.log_prob_use_dynamic_bsz",
            f"{ROLLOUT}.log_prob_max_token_len_per_gpu",
        ),
        _NO_EFFECT_LOGPROB,
    ),
    **dict.fromkeys(
        (
            "data.dataloader_num_workers",
            "data.use_shm",
            "data.return_raw_chat",
            "data.return_raw_input_ids",
            "data.return_full_prompt",
            "data.tokenizer",
            "data.filter_overlong_prompts_workers",
            "data.trust_remote_code",
            f"{MODEL}.trust_remote_code",
            "data.return_multi_modal_inputs",
        ),
        _NO_EFFECT_DATA,
    ),
    **dict.fromkeys(
        (
            "trainer.val_before_train",
            "trainer.val_only",
            "data.val_batch_size",
            "data.validation_shuffle",
            "data.val_max_samples",
        ),
        _NO_EFFECT_VAL,
    ),
    **dict.fromkeys(("algorithm.gamma", "algorithm.lam"), "GAE setting: GRPO group advantages do not use it"),
    "algorithm.pf_ppo.": "policy-filtered PPO's reweighting: off (algorithm.use_pf_ppo false)",
}
# verl key -> why asp-npu cannot run a config that sets it (when `refused(value)`)
REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "algorithm.use_pf_ppo": (bool, "policy-filtered PPO (use_pf_ppo) is not supported"),
    "transfer_queue.enable": (
        bool,
        "verl's TransferQueue data path: asp-npu has its own queue; set it false",
    ),
    "algorithm.adv_estimator": (
        lambda v: v != "grpo",
        "only grpo (group advantages) is supported: PPO with a critic (gae) and the other estimators are not",
    ),
    "reward_model.enable": (bool, "reward models are not supported: asp-npu scores with rule verifiers"),
    f"{MODEL}.lora_rank": (
        lambda v: int(v or 0) > 0,
        "LoRA training is not supported: the asp-npu trainer updates all weights",
    ),
    f"{ROLLOUT}.multi_turn.enable": (bool, "multi-turn tool-calling rollouts are not supported"),
    f"{ROLLOUT}.ignore_eos": (
        bool,
        "ignore_eos generates past the end of every answer; asp-npu stops at EOS",
    ),
    f"{ACTOR}.policy_loss.loss_mode": (
        lambda v: v != "vanilla",
        "only verl's vanilla (PPO-clip) policy loss is supported",
    ),
    "trainer.critic_warmup": (lambda v: int(v or 0) > 0, "critic warm-up needs a critic (not supported)"),
    f"{ROLLOUT}.do_sample": (
        lambda v: not v,
        "greedy training rollouts (do_sample false) give a GRPO group one answer n times",
    ),
    "data.reward_fn_key": (
        lambda v: v != "data_source",
        "asp-npu selects the reward rule by each row's data_source",
    ),
    "data.custom_cls.path": (bool, "custom dataset classes are not supported"),
}
# a verl key with a meaning asp-npu does not reproduce exactly: imported, but listed to review
REVIEW: dict[str, str] = {
    "data.filter_overlong_prompts": "verl drops prompts longer than max_prompt_length; asp-npu keeps every "
    "prompt that fits the model's context",
    "data.truncation": "verl's handling of a prompt over max_prompt_length; asp-npu keeps every prompt that "
    "fits the model's context",
    "data.shuffle": "verl shuffles the prompts each epoch with data.seed; asp-npu's order comes from "
    "data.seed",
    f"{ACTOR}.fsdp_config.mixed_precision.": "FSDP's mixed-precision dtypes; asp-npu trains in model.dtype "
    "(megatron-core, fp32 master weights)",
    "data.gen_batch_size": "verl generates this many prompts per round under dynamic sampling; asp-npu "
    "admits replacements by need (the same groups are trained)",
}


def flatten_verl(raw: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested sections and dotted keys alike -> {dotted key: value}; a Hydra `+`/`++` prefix is dropped."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        key = f"{prefix}{str(k).lstrip('+')}"
        if isinstance(v, dict) and v and key != "defaults":
            out.update(flatten_verl(v, key + "."))
        else:
            out[key] = v
    return out


def _match(table: dict[str, Any], key: str) -> Any:
    """The entry for `key`: exact, else the longest prefix entry ending in '.'."""
    if key in table:
        return table[key]
    hits = [p for p in table if p.endswith(".") and key.startswith(p)]
    return table[max(hits, key=len)] if hits else None


class VerlImport:
    """The walk over one verl file: the user's keys (`keys`), verl's defaults under them (`get`)."""

    def __init__(self, keys: dict[str, Any], source: Path) -> None:
        self.keys, self.source = keys, source
        self.tr = ic.Translation()
        self.review: list[tuple[str, str]] = []

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.keys and self.keys[key] is not None:
            return self.keys[key]
        return VERL_DEFAULTS.get(key, default)

    def num(self, key: str) -> float:
        return ic._as_float(key, self.get(key))

    def int(self, key: str) -> int:
        return ic._as_int(key, self.get(key))

    def put(self, src: str, ours: str, value: Any) -> None:
        """Set our key; the ledger counts `src` only when the file itself has it."""
        self.tr.set(src, ours, value)
        if src not in self.keys and src in self.tr.mapped:
            self.tr.mapped.remove(src)


def check_verl(raw: Any, source: Path) -> dict[str, Any]:
    """The file's keys, or one line why it is not a verl config / cannot be run (before any translation)."""
    if not isinstance(raw, dict):
        raise UserError(f"{source}: expected a verl config (a YAML mapping), got {type(raw).__name__}")
    keys = flatten_verl(raw)
    tops = {k.split(".")[0] for k in keys}
    if not tops & {"data", "actor_rollout_ref", "algorithm", "trainer"}:
        raise UserError(
            f"{source}: not a verl config (no data / actor_rollout_ref / algorithm / trainer keys)"
        )
    unknown = sorted(t for t in tops if t not in VERL_SECTIONS)
    if unknown:
        raise UserError(f"{source}: {unknown[0]}: not a verl section ({', '.join(VERL_SECTIONS[:-1])})")
    merged = {**VERL_DEFAULTS, **{k: v for k, v in keys.items() if v is not None}}
    for key, (refused, why) in REFUSED.items():
        try:
            stop = key in merged and refused(merged[key])
        except (TypeError, ValueError):
            raise UserError(f"{source}: {key}: unexpected value {merged[key]!r}") from None
        if stop:
            raise UserError(f"{source}: cannot import: {key}={merged[key]!r}: {why}")
    if str(merged.get("critic.enable", "")).lower() == "true":
        raise UserError(f"{source}: cannot import: critic.enable: PPO with a critic is not supported")
    return keys


def translate_verl(raw: Any, source: Path, card: str | None = None, mode: str = "asp") -> ic.Translation:
    """A verl config (parsed YAML) -> Translation (our overrides + ledger); UserError for an unknown key or
    one asp-npu cannot run (one line)."""
    v = VerlImport(check_verl(raw, source), source)
    try:
        for step in (_batches, _kl, _loss_and_sampling, _dapo, _reward_and_optim, _data_and_trainer, _rest):
            step(v)
        v.tr.unmapped += v.review
        _model(v)
        v.tr.out.setdefault("rl_config", {}).setdefault("max_lag", 0 if mode in COLOCATED_MODES else 2)
        _place(v, card, mode)
    except UserError as exc:  # every line names the file
        raise UserError(str(exc) if str(exc).startswith(str(source)) else f"{source}: {exc}") from None
    return v.tr


def _batches(v: VerlImport) -> None:
    n = v.int(f"{ROLLOUT}.n")
    gbs = v.int("data.train_batch_size")
    mini = v.int(f"{ACTOR}.ppo_mini_batch_size")
    v.put("algorithm.adv_estimator", "rl_config.adv_estimator", "group_norm")
    v.put(f"{ROLLOUT}.n", "rl_config.n_samples_per_prompt", n)
    v.put("data.train_batch_size", "rl_config.global_batch_size", gbs)
    if mini > gbs:
        v.tr.notes.append(
            f"{ACTOR}.ppo_mini_batch_size {mini} > data.train_batch_size {gbs}: a minibatch is "
            "the whole iteration"
        )
    v.put(f"{ACTOR}.ppo_mini_batch_size", "rl_config.mini_batch_size", min(mini, gbs) * n)
    v.tr.notes.append(
        f"rl_config.mini_batch_size: {min(mini, gbs)} prompts (verl) x n {n} = {min(mini, gbs) * n} "
        "samples (asp-npu counts samples)"
    )


def _kl(v: VerlImport) -> None:
    """One KL term: in the loss (actor.use_kl_loss) or in the reward (algorithm.use_kl_in_reward)."""
    in_loss, in_reward = bool(v.get(f"{ACTOR}.use_kl_loss")), bool(v.get("algorithm.use_kl_in_reward"))
    if in_loss and in_reward:
        raise UserError(
            f"{v.source}: cannot import: {ACTOR}.use_kl_loss and algorithm.use_kl_in_reward are "
            "both on: asp-npu applies one KL term (in the loss or in the reward)"
        )
    v.put(f"{ACTOR}.use_kl_loss", "rl_config.use_kl_in_reward", in_reward)
    v.put("algorithm.use_kl_in_reward", "rl_config.use_kl_in_reward", in_reward)
    if in_loss:
        v.put(f"{ACTOR}.kl_loss_coef", "rl_config.kl_coef", v.num(f"{ACTOR}.kl_loss_coef"))
        v.put(f"{ACTOR}.kl_loss_type", "rl_config.kl_penalty", _kl_name(v, f"{ACTOR}.kl_loss_type"))
    elif in_reward:
        v.put("algorithm.kl_ctrl.kl_coef", "rl_config.kl_coef", v.num("algorithm.kl_ctrl.kl_coef"))
        v.put("algorithm.kl_penalty", "rl_config.kl_penalty", _kl_name(v, "algorithm.kl_penalty"))
        for leaf, ours in (("type", "kl_ctrl_type"), ("target_kl", "kl_target"), ("horizon", "kl_horizon")):
            if f"algorithm.kl_ctrl.{leaf}" in v.keys:
                value = v.get(f"algorithm.kl_ctrl.{leaf}")
                v.put(
                    f"algorithm.kl_ctrl.{leaf}",
                    f"rl_config.{ours}",
                    str(value) if leaf == "type" else ic._as_float(f"algorithm.kl_ctrl.{leaf}", value),
                )
    else:
        v.put(f"{ACTOR}.use_kl_loss", "rl_config.kl_coef", 0.0)
    for key in [
        k
        for k in v.keys
        if k.startswith(("algorithm.kl_ctrl.", f"{ACTOR}.kl_loss_")) or k == "algorithm.kl_penalty"
    ]:
        if key not in v.tr.mapped:
            v.tr.skip(key, "no effect: that KL term is off (use_kl_loss / use_kl_in_reward)")


def _kl_name(v: VerlImport, key: str) -> str:
    from asp_npu.config import KL_PENALTIES

    name = str(v.get(key))
    if name not in KL_PENALTIES:
        raise UserError(
            f"{v.source}: cannot import: {key}={name}: asp-npu's KL estimators are {', '.join(KL_PENALTIES)}"
        )
    return name


# verl key -> (our key, type): the same setting under asp-npu's name
_SAME: dict[str, tuple[str, type]] = {
    f"{ACTOR}.clip_ratio_c": ("rl_config.clip_ratio_c", float),
    f"{ACTOR}.loss_agg_mode": ("rl_config.loss_agg_mode", str),
    f"{ACTOR}.entropy_coeff": ("rl_config.entropy_coeff", float),
    f"{ACTOR}.ppo_micro_batch_size_per_gpu": ("actor_config.micro_batch_size", int),
    f"{ACTOR}.use_dynamic_bsz": ("actor_config.use_dynamic_bsz", bool),
    f"{ACTOR}.ppo_max_token_len_per_gpu": ("actor_config.ppo_max_token_len_per_gpu", int),
    f"{MODEL}.use_remove_padding": ("actor_config.use_remove_padding", bool),
    "algorithm.norm_adv_by_std_in_grpo": ("rl_config.norm_adv_by_std_in_grpo", bool),
    f"{ROLLOUT}.temperature": ("generate_config.sampling_config.temperature", float),
    f"{ROLLOUT}.top_p": ("generate_config.sampling_config.top_p", float),
    f"{ROLLOUT}.top_k": ("generate_config.sampling_config.top_k", int),
    f"{ROLLOUT}.min_p": ("generate_config.sampling_config.min_p", float),
    f"{ROLLOUT}.tensor_model_parallel_size": ("generate_config.infer_tensor_parallel_size", int),
    f"{ROLLOUT}.gpu_memory_utilization": ("generate_config.gpu_memory_utilization", float),
    f"{ROLLOUT}.max_num_seqs": ("generate_config.max_num_seqs", int),
    f"{ROLLOUT}.max_num_batched_tokens": ("generate_config.max_num_batched_tokens", int),
    f"{ROLLOUT}.max_model_len": ("generate_config.max_model_len", int),
    f"{ROLLOUT}.enforce_eager": ("generate_config.enforce_eager", bool),
    f"{ROLLOUT}.val_kwargs.do_sample": ("generate_config.val_kwargs.do_sample", bool),
    f"{ROLLOUT}.val_kwargs.temperature": ("generate_config.val_kwargs.temperature", float),
    f"{ROLLOUT}.val_kwargs.top_p": ("generate_config.val_kwargs.top_p", float),
    f"{ROLLOUT}.val_kwargs.n": ("generate_config.val_kwargs.n", int),
}

# keys REFUSED checks, at a value it accepts: what asp-npu always does (mapped)
_ACCEPTED = (
    "algorithm.use_pf_ppo",
    "transfer_queue.enable",
    f"{ROLLOUT}.do_sample",
    f"{ROLLOUT}.ignore_eos",
    f"{ROLLOUT}.multi_turn.enable",
    f"{ACTOR}.policy_loss.loss_mode",
    f"{MODEL}.lora_rank",
    "reward_model.enable",
    "trainer.critic_warmup",
    "data.reward_fn_key",
    "critic.enable",
)


def _loss_and_sampling(v: VerlImport) -> None:
    clip = v.num(f"{ACTOR}.clip_ratio")
    for side in ("low", "high"):  # verl: clip_ratio_low / _high default to clip_ratio
        key = f"{ACTOR}.clip_ratio_{side}"
        v.put(
            key if key in v.keys else f"{ACTOR}.clip_ratio",
            f"rl_config.clip_ratio_{side}",
            v.num(key) if v.get(key) is not None else clip,
        )
    for key, (ours, kind) in _SAME.items():
        if v.get(key) is not None:
            v.put(key, ours, _convert(key, v.get(key), kind))
    for key in _ACCEPTED:
        if key in v.keys:  # at a value REFUSED accepts: what asp-npu always does
            v.tr.mapped.append(key)
    if v.get(f"{ROLLOUT}.val_kwargs.top_k") in (-1, 0, None):
        if f"{ROLLOUT}.val_kwargs.top_k" in v.keys:
            v.tr.mapped.append(f"{ROLLOUT}.val_kwargs.top_k")
    sampling = {k: v.get(f"{ROLLOUT}.{k}") for k in ("top_p", "top_k", "min_p")}
    ic.truncation_defaults(v.tr, {k: x for k, x in sampling.items() if x is not None}, ROLLOUT, "verl")
    dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(
        str(v.get(f"{ROLLOUT}.dtype")), str(v.get(f"{ROLLOUT}.dtype"))
    )
    v.put(f"{ROLLOUT}.dtype", "model.dtype", dtype)  # verl: bf16 rollout, bf16 FSDP compute


def _convert(key: str, value: Any, kind: type) -> Any:
    if kind is float:
        return ic._as_float(key, value)
    if kind is int:
        return ic._as_int(key, value)
    if kind is bool:
        if not isinstance(value, bool):
            raise UserError(f"{key}: expected true or false, got {value!r}")
        return value
    return str(value)


_VERL_FILTER_METRICS = {
    "acc": "score",
    "score": "score",
    "seq_reward": "reward",
    "seq_final_reward": "reward",
}


def _dapo(v: VerlImport) -> None:
    """algorithm.filter_groups and reward_model.overlong_buffer (verl's DAPO)."""
    if v.get("algorithm.filter_groups.enable") is not None:
        v.put(
            "algorithm.filter_groups.enable",
            "rl_config.drop_equal_reward_groups",
            bool(v.get("algorithm.filter_groups.enable")),
        )
    metric = v.get("algorithm.filter_groups.metric")
    if metric is not None:
        ours = _VERL_FILTER_METRICS.get(str(metric))
        if ours is None:
            raise UserError(
                f"{v.source}: cannot import: algorithm.filter_groups.metric={metric}: asp-npu filters "
                f"on {', '.join(_VERL_FILTER_METRICS)} (verl's names)"
            )
        if metric == "seq_final_reward" and v.get("algorithm.use_kl_in_reward"):
            raise UserError(
                f"{v.source}: cannot import: algorithm.filter_groups.metric=seq_final_reward with "
                "use_kl_in_reward: asp-npu filters before the KL is known"
            )
        v.put("algorithm.filter_groups.metric", "rl_config.filter_groups_metric", ours)
    if v.get("algorithm.filter_groups.max_num_gen_batches") is not None:
        v.put(
            "algorithm.filter_groups.max_num_gen_batches",
            "rl_config.filter_groups_max_batches",
            v.int("algorithm.filter_groups.max_num_gen_batches"),
        )
    for leaf, ours, kind in (
        ("enable", "overlong_buffer_enable", bool),
        ("len", "overlong_buffer", int),
        ("penalty_factor", "overlong_buffer_penalty_factor", float),
    ):
        key = f"reward_model.overlong_buffer.{leaf}"
        if v.get(key) is not None:
            v.put(key, f"rl_config.{ours}", _convert(key, v.get(key), kind))


def _reward_and_optim(v: VerlImport) -> None:
    """translate_verl_reward / translate_verl_actor, merged into the walk's translation."""
    nested: dict[str, Any] = {}
    for key, value in v.keys.items():
        if key.startswith(("custom_reward_function.", "reward_model.reward_manager", f"{ACTOR}.optim.")):
            node = nested
            *parents, leaf = key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
    optim = {
        **{"lr": v.get(f"{ACTOR}.optim.lr"), "weight_decay": v.get(f"{ACTOR}.optim.weight_decay")},
        **nested.get("actor_rollout_ref", {}).get("actor", {}).get("optim", {}),
    }
    for leaf, implied in (("optimizer", "AdamW"), ("optimizer_impl", "torch.optim")):
        if leaf in optim:  # megatron-core's Adam with decoupled weight decay is verl's default AdamW
            value = optim.pop(leaf)
            if value != implied:
                raise UserError(
                    f"{v.source}: cannot import: {ACTOR}.optim.{leaf}={value}: asp-npu trains with "
                    f"{implied} (megatron-core's Adam, decoupled weight decay)"
                )
            v.tr.mapped.append(f"{ACTOR}.optim.{leaf}")
    actor = {
        "optim": optim,
        **{
            k: v.keys[f"{ACTOR}.{k}"]
            for k in ("ppo_epochs", "shuffle", "grad_clip")
            if f"{ACTOR}.{k}" in v.keys
        },
    }
    for part in (ic.translate_verl_reward(nested), ic.translate_verl_actor(actor)):
        _merge(v, part)
    unknown = [k for k, why in v.tr.unmapped if why == "no asp-npu equivalent"]
    if unknown:
        raise UserError(
            f"{v.source}: {unknown[0]}: a verl key asp-npu does not know or support; remove it or "
            "set it in the translated config by hand"
        )


def _merge(v: VerlImport, part: ic.Translation) -> None:
    for section, body in part.out.items():
        for key, value in body.items() if isinstance(body, dict) else ():
            v.tr.out.setdefault(section, {})[key] = value
    v.tr.mapped += [k for k in part.mapped if k in v.keys and k not in v.tr.mapped]
    v.tr.unmapped += [(k, why) for k, why in part.unmapped if k in v.keys]
    v.tr.notes += part.notes


def _data_and_trainer(v: VerlImport) -> None:
    files = v.get("data.train_files")
    if isinstance(files, list):
        if len(files) != 1:
            raise UserError(
                f"{v.source}: cannot import: data.train_files: {len(files)} files; asp-npu reads one"
            )
        files = files[0]
    if files is not None:
        v.put("data.train_files", "data.data_path", str(files))
    val = v.get("data.val_files")
    if isinstance(val, list) and len(val) != 1:
        raise UserError(f"{v.source}: cannot import: data.val_files: {len(val)} files; asp-npu reads one")
    if val is not None:
        v.put("data.val_files", "data.val_files", str(val[0] if isinstance(val, list) else val))
    for key, ours, kind in (
        ("data.prompt_key", "data.prompt_key", str),
        ("data.seed", "data.seed", int),
        ("data.max_prompt_length", "rl_config.max_prompt_length", int),
        ("data.max_response_length", "generate_config.sampling_config.max_tokens", int),
        ("trainer.save_freq", "trainer.save_freq", int),
        ("trainer.test_freq", "trainer.test_freq", int),
        ("trainer.project_name", "trainer.project_name", str),
        ("trainer.experiment_name", "trainer.experiment_name", str),
        ("data.train_max_samples", "data.num_prompts", int),
    ):
        if v.get(key) is not None:
            value = _convert(key, v.get(key), kind)
            if key == "data.train_max_samples" and value < 0:  # verl -1: every row (asp-npu 0)
                value = 0
            if key == "trainer.save_freq" and value < 0:  # verl -1: never; asp-npu 0: only at the end
                value = 0
            v.put(key, ours, value)
    _train_iters(v)
    _loggers(v)
    from asp_npu.device import DEVICE_SETTINGS

    device = str(v.get("trainer.device"))
    v.put("trainer.device", "trainer.device", device if device in DEVICE_SETTINGS else "auto")


def _train_iters(v: VerlImport) -> None:
    """verl runs total_training_steps, else len(dataloader) x total_epochs (batches of train_batch_size,
    the last partial one dropped): counted here when the training file is on this machine."""
    steps = v.get("trainer.total_training_steps")
    if steps is not None:
        v.put(
            "trainer.total_training_steps",
            "trainer.train_iters",
            ic._as_int("trainer.total_training_steps", steps),
        )
        if "trainer.total_epochs" in v.keys:
            v.tr.mapped.append("trainer.total_epochs")
        return
    epochs, gbs = v.int("trainer.total_epochs"), v.int("data.train_batch_size")
    rows = _rows(str(v.get("data.train_files") or ""))
    if rows:
        v.put("trainer.total_epochs", "trainer.train_iters", max(1, rows // gbs) * epochs)
        v.tr.notes.append(f"trainer.train_iters: {rows} rows // {gbs} prompts x {epochs} epochs")
    elif "trainer.total_epochs" in v.keys:
        v.review.append(
            (
                "trainer.total_epochs",
                f"verl runs rows // data.train_batch_size x {epochs} steps; "
                "the training file is not here to count: set trainer.train_iters",
            )
        )


def _rows(path: str) -> int:
    """Rows of a local Parquet / JSONL file (0 when not here or unreadable)."""
    p = Path(path).expanduser()
    if not p.is_file():
        return 0
    try:
        if p.suffix == ".parquet":
            import pyarrow.parquet as pq

            return int(pq.ParquetFile(p).metadata.num_rows)
        with p.open(encoding="utf-8") as f:
            return sum(1 for line in f if line.strip())
    except (OSError, UnicodeDecodeError, ValueError, ImportError):
        return 0


def _loggers(v: VerlImport) -> None:
    from asp_npu.config import LOGGERS

    if "trainer.logger" not in v.keys:
        return
    raw = v.keys["trainer.logger"]
    names = raw if isinstance(raw, list) else re.findall(r"[A-Za-z_]+", str(raw))
    kept = [str(n) for n in names if str(n) in LOGGERS]
    dropped = [str(n) for n in names if str(n) not in LOGGERS]
    v.put("trainer.logger", "trainer.logger", [*dict.fromkeys(["jsonl", *kept])])
    if dropped:
        v.tr.notes.append(
            f"trainer.logger: {', '.join(dropped)} not available in asp-npu ({', '.join(LOGGERS)})"
        )


def _rest(v: VerlImport) -> None:
    """Every other key of the file: no effect, to review, or unknown (one line, exit 2)."""
    for key in v.keys:
        if key in v.tr.mapped or any(k == key for k, _ in v.tr.unmapped) or key == "trainer.logger":
            continue
        if key in (
            f"{MODEL}.path",
            "trainer.nnodes",
            "trainer.n_gpus_per_node",
            "data.train_files",
            "trainer.total_epochs",
        ):
            continue  # `_model` / `_place` / `_train_iters`
        review, quiet = _match(REVIEW, key), _match(NO_EFFECT, key)
        if key.endswith("._target_") or key == "custom_reward_function.name":
            v.tr.skip(key, "no effect: a Hydra target class, or the name of an unset custom reward function")
        elif review:
            v.review.append((key, review))
        elif quiet:
            v.tr.skip(key, quiet)
        elif v.keys[key] is None:
            v.tr.skip(key, "empty (null) in the file: left at asp-npu's default")
        else:
            raise UserError(
                f"{v.source}: {key}: a verl key asp-npu does not know or support; remove it or "
                "set it in the translated config by hand"
            )


def _model(v: VerlImport) -> None:
    path = v.get(f"{MODEL}.path")
    if path is None:
        v.tr.notes.append(f"{MODEL}.path missing: model.path left at asp-npu's default")
        return
    v.put(f"{MODEL}.path", "model.path", str(path))
    v.tr.out["model"]["build_if_missing"] = False
    name = re.sub(r"[^a-z0-9]", "", Path(str(path)).name.lower())
    name = re.sub(r"(instruct|base|chat)$", "", name)
    for known in ic.KNOWN_MODELS:
        if re.sub(r"[^a-z0-9]", "", known) == name:
            v.tr.out["model"]["arch"] = dict(ic.KNOWN_MODELS[known])
            v.tr.notes.append(f"model.arch from asp-npu's table for {known}")
            return
    v.tr.notes.append(
        f"model '{Path(str(path)).name}': architecture not in asp-npu's table; asp-npu check "
        "reads model.path/config.json"
    )


def _place(v: VerlImport, card: str | None, mode: str) -> None:
    """verl's trainer.nnodes x n_gpus_per_node, split by the layout search (or colocated)."""
    total = v.int("trainer.nnodes") * v.int("trainer.n_gpus_per_node")
    for key in ("trainer.nnodes", "trainer.n_gpus_per_node"):
        if key in v.keys:
            v.tr.mapped.append(key)
    base = ic._as_config(v.tr.out)
    bad = range_problems(base)
    if bad:
        raise UserError(f"{v.source}: translated {bad[0]}")
    if not v.tr.out.get("model", {}).get("arch") and not (Path(base.model.path) / "config.json").is_file():
        v.tr.notes.append(
            f"layout: {total} devices; the model's architecture is unknown here, so the split is "
            "left at asp-npu's defaults: run asp-npu check --suggest on the cluster"
        )
        return
    _fsdp(v, mode)
    card_name = card or ic.card_from_name(str(v.source)) or "910b"
    key = "ppo_max_token_len_per_gpu" if base.actor_config.use_dynamic_bsz else "micro_batch_size"
    first = int(getattr(base.actor_config, key))
    floor = base.rl_config.max_prompt_length + base.generate_config.sampling_config.max_tokens
    tried: list[ic.Translation] = []
    for tp, pp, size, offload in _candidates(
        first, mode in COLOCATED_MODES, total, floor if key != "micro_batch_size" else 1
    ):
        trial = copy.deepcopy(v.tr)
        tried.append(trial)
        act = trial.out.setdefault("actor_config", {})
        act[key] = size
        if mode in COLOCATED_MODES:  # the layout search picks TP/PP itself in a disaggregated mode
            act.update(
                tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, sequence_parallel=tp > 1
            )
            if offload:  # host memory while the engines generate: speed, never the result
                act.update(offload_train_param=True, offload_train_grad=True, offload_train_optimizer=True)
        ic._choose_layout(_fit_config(trial.out), total, card_name, mode, trial)
        if trial.fits:
            break
    else:  # nothing fits: the file's own sizes, and `asp-npu check` says what does not fit
        trial = tried[0]
    v.tr.__dict__.update(trial.__dict__)
    size = int(v.tr.out["actor_config"][key])
    if size != first:  # micro-batches are summed into one step: their size changes memory and speed only
        v.tr.notes.append(
            f"actor_config.{key} {first} -> {size}: verl's micro-batch does not fit asp-npu's "
            f"trainer on {total} devices; micro-batches are summed, so the trained result is the same"
        )


def _fit_config(out: dict[str, Any]) -> Any:
    """The translated config as `asp-npu check` sees it on the cluster: the data files live there, and a run
    length the file could not give (total_epochs without the data) does not bound the warm-up."""
    cfg = ic._as_config(out)
    cfg.data.val_files, cfg.trainer.test_freq = "", 0
    if "train_iters" not in out.get("trainer", {}):
        cfg.trainer.train_iters = 10**6
    return cfg


def _candidates(first: int, colocated: bool, total: int, floor: int) -> list[tuple[int, int, int, bool]]:
    """(TP, PP, micro-batch size, offload while generating) to try: without offload first, then the smallest
    split and the file's micro-batch first; a token budget never below one whole sequence (`floor`)."""
    sizes = [first] + ([max(floor, 1)] if first > max(floor, 1) else [])
    splits = [(tp, pp) for tp in (1, 2, 4, 8) for pp in (1, 2, 4, 8) if total % (tp * pp) == 0]
    splits = splits if colocated else [(1, 1)]
    order = sorted(splits, key=lambda s: (s[0] * s[1], s[1]))
    return [
        (tp, pp, n, off)
        for off in ((False, True) if colocated else (False,))
        for tp, pp in order
        for n in sizes
    ]


def _fsdp(v: VerlImport, mode: str) -> None:
    """verl's FSDP shards optimizer state over the data-parallel ranks: megatron-core's distributed optimizer
    does that for asp-npu's trainer; FSDP's offload, in a colocated mode, is the trainer's offload."""
    act = v.tr.out.setdefault("actor_config", {})
    act["use_distributed_optimizer"] = True
    v.tr.notes.append(
        "actor_config.use_distributed_optimizer: verl's FSDP shards the optimizer state over the "
        "data-parallel ranks; megatron-core's distributed optimizer does the same"
    )
    if mode not in COLOCATED_MODES:
        return
    for leaf, ours in (
        ("param_offload", "offload_train_param"),
        ("optimizer_offload", "offload_train_optimizer"),
    ):
        key = f"{ACTOR}.fsdp_config.{leaf}"
        if v.keys.get(key):
            act[ours] = True
            v.tr.unmapped = [(k, why) for k, why in v.tr.unmapped if k != key]
            v.tr.mapped.append(key)


def render_verl_yaml(tr: ic.Translation, source: Path) -> str:
    """The translated config with its ledger as comments (the MindSpeed-RL importer's layout)."""
    return (
        ic.render_yaml(tr, source)
        .replace("from MindSpeed-RL config", "from verl config", 1)
        .replace("import-config mindspeed-rl", "import-config verl", 1)
    )
