"""The model's dimensions for `asp-npu check` (`asp_npu.arch.ModelDims`, whose parameter counts split
into the parts megatron-core shards differently and give the KV-cache bytes per token vLLM
allocates), resolved from `model.arch` and the HF folder's config.json, with their problems.

Families: qwen2 (q/k/v biases), qwen3 (no biases, q/k RMSNorm), qwen3_moe (qwen3 attention, every
MLP a routed MoE), llama (no biases), deepseek_v3 (multi-latent attention, leading dense layers, MoE
with a shared expert). Pure arithmetic: no torch, no hardware.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from asp_npu.arch import UNSUPPORTED, ModelDims
from asp_npu.config import Config

FAMILIES = ("qwen2", "qwen3", "qwen3_moe", "llama", "deepseek_v3")
# Architectures `check` can size but the trainer cannot build: the trainer's own list (one place).
TRAINER_CANNOT_BUILD: dict[str, str] = {k: v for k, v in UNSUPPORTED.items() if k in FAMILIES}


_HF_KEYS = {  # our field -> HF config.json key(s), first found wins
    "hidden_size": ("hidden_size",),
    "num_layers": ("num_hidden_layers",),
    "num_attention_heads": ("num_attention_heads",),
    "num_key_value_heads": ("num_key_value_heads",),
    "vocab_size": ("vocab_size",),
    "intermediate_size": ("intermediate_size",),
    "max_position_embeddings": ("max_position_embeddings",),
    "tie_word_embeddings": ("tie_word_embeddings",),
    "model_type": ("model_type",),
    "head_dim": ("head_dim",),
    "num_experts": ("num_experts", "n_routed_experts"),
    "moe_router_topk": ("num_experts_per_tok",),
    "moe_ffn_hidden_size": ("moe_intermediate_size",),
    "first_k_dense_replace": ("first_k_dense_replace",),
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_head_dim": ("qk_nope_head_dim",),
    "qk_pos_emb_head_dim": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
}
_REQUIRED = (
    "hidden_size",
    "num_layers",
    "num_attention_heads",
    "vocab_size",
    "intermediate_size",
    "max_position_embeddings",
)


def _from_hf(hf: dict, ours: str) -> object:
    for key in _HF_KEYS.get(ours, ()):
        if hf.get(key) is not None:
            return hf[key]
    if ours == "moe_shared_expert_intermediate_size":
        if hf.get("shared_expert_intermediate_size"):
            return hf["shared_expert_intermediate_size"]
        return int(hf.get("n_shared_experts") or 0) * int(hf.get("moe_intermediate_size") or 0)
    return None


def resolve_arch(cfg: Config) -> tuple[ModelDims | None, list[str], str]:
    """Architecture from `model.arch` (explicit values win) filled in from model.path/config.json.

    Returns (arch or None, problems, source description)."""
    known = {f.name for f in fields(ModelDims)}
    given = {k: v for k, v in asdict(cfg.model.arch).items() if k in known}  # trainer-only keys ignored
    cfg_json = Path(cfg.model.path) / "config.json"
    hf, source, unreadable = _read_hf_config(cfg_json, given)
    if unreadable:
        return None, [unreadable], source
    values = _merged_values(given, hf)
    missing = [k for k in _REQUIRED if not values[k]]
    if missing:
        return (
            None,
            [
                f"model.arch.{', model.arch.'.join(missing)}: unknown -- set them in the config or point "
                f"model.path at an HF folder with config.json (looked for {cfg_json})"
            ],
            source,
        )
    mt = str(values["model_type"] or cfg.model.architecture.replace("-", "_") or "qwen2")
    if mt not in FAMILIES:
        return (
            None,
            [f"model.arch.model_type: '{mt}' is not a known architecture (known: {', '.join(FAMILIES)})"],
            source,
        )
    kwargs: dict[str, Any] = {
        k: (int(v or 0) if k not in ("tie_word_embeddings", "model_type") else v) for k, v in values.items()
    }
    kwargs["tie_word_embeddings"] = bool(values["tie_word_embeddings"])
    kwargs["model_type"] = mt
    arch = ModelDims(**kwargs)
    head_dim_given = bool(given["head_dim"] or hf.get("head_dim"))
    return arch, _arch_problems(arch, mt, head_dim_given), source


def _read_hf_config(cfg_json: Path, given: dict) -> tuple[dict, str, str]:
    """(HF config or {}, source description, problem or ""): a missing config.json is no problem, since
    model.arch may say everything; an unreadable one is, so users do not get a silently wrong model."""
    source = "model.arch"
    if not cfg_json.is_file():
        return {}, source, ""
    try:
        hf = json.loads(cfg_json.read_text())
        hf = hf.get("text_config", hf)
        source = f"{cfg_json} + model.arch" if any(given.values()) else str(cfg_json)
    except (OSError, ValueError) as exc:
        return {}, source, f"model.path: cannot read {cfg_json}: {exc}"
    return hf, source, ""


def _merged_values(given: dict, hf: dict) -> dict:
    """Each field from model.arch, else from config.json; no KV-head count means MHA (kv heads = heads)."""
    values: dict = {}
    for ours in given:
        v = given[ours] or _from_hf(hf, ours)
        if ours == "num_key_value_heads" and not v:
            v = given["num_attention_heads"] or hf.get("num_attention_heads")  # no GQA = MHA
        values[ours] = v
    return values


def _arch_problems(arch: ModelDims, mt: str, head_dim_given: bool) -> list[str]:
    """Inconsistencies that would make megatron-core or vLLM fail late: head counts, MoE and MLA fields."""
    problems = []
    if not arch.mla and arch.num_attention_heads % arch.num_key_value_heads:
        problems.append(
            f"model.arch: num_attention_heads {arch.num_attention_heads} is not a multiple of "
            f"num_key_value_heads {arch.num_key_value_heads}"
        )
    if (mt in ("qwen3_moe", "deepseek_v3")) != arch.moe:
        problems.append(
            f"model.arch: model_type {mt} {'needs' if not arch.moe else 'has no'} num_experts "
            f"(got {arch.num_experts})"
        )
    elif arch.moe and not (0 < arch.moe_router_topk <= arch.num_experts and arch.moe_ffn_hidden_size > 0):
        problems.append(
            f"model.arch: MoE needs 0 < moe_router_topk <= num_experts and moe_ffn_hidden_size > 0 (got topk "
            f"{arch.moe_router_topk}, {arch.num_experts} experts, ffn {arch.moe_ffn_hidden_size})"
        )
    if (mt == "deepseek_v3") != arch.mla:
        problems.append(
            f"model.arch: model_type {mt} and kv_lora_rank {arch.kv_lora_rank} disagree (MLA is DeepSeek's)"
        )
    elif not arch.mla and arch.hidden_size % arch.num_attention_heads and not head_dim_given:
        problems.append(
            f"model.arch: hidden_size {arch.hidden_size} is not divisible by num_attention_heads "
            f"{arch.num_attention_heads} (set model.arch.head_dim)"
        )
    return problems
