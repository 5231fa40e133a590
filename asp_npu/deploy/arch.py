"""Model architecture numbers for `asp-npu check`: parameter counts split into the parts megatron-core
shards differently (dense weights over TP, routed experts over EP x expert-TP), and the KV-cache
bytes per token vLLM allocates.

Families: qwen2 (q/k/v biases), qwen3 (no biases, q/k RMSNorm), qwen3_moe (qwen3 attention, every
MLP a routed MoE), llama (no biases), deepseek_v3 (multi-latent attention, leading dense layers, MoE
with a shared expert). Pure arithmetic: no torch, no hardware.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from asp_npu.arch import UNSUPPORTED
from asp_npu.config import Config

FAMILIES = ("qwen2", "qwen3", "qwen3_moe", "llama", "deepseek_v3")
# Architectures `check` can size but the trainer cannot build: the trainer's own list (one place).
TRAINER_CANNOT_BUILD: dict[str, str] = {k: v for k, v in UNSUPPORTED.items() if k in FAMILIES}


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
    model_type: str = "qwen2"
    head_dim: int = 0
    num_experts: int = 0
    moe_router_topk: int = 0
    moe_ffn_hidden_size: int = 0
    moe_shared_expert_intermediate_size: int = 0
    first_k_dense_replace: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_head_dim: int = 0
    qk_pos_emb_head_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // max(1, self.num_attention_heads))

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    @property
    def moe_layers(self) -> int:
        return max(0, self.num_layers - self.first_k_dense_replace) if self.moe else 0

    @property
    def attention_params(self) -> int:
        """One layer's attention: GQA q/k/v/o (+ qkv biases for qwen2, + q/k norms for qwen3), or MLA."""
        h, a, hd = self.hidden_size, self.num_attention_heads, self.head_dim
        if self.mla:
            qk = self.qk_head_dim + self.qk_pos_emb_head_dim
            q = (
                (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * a * qk)
                if self.q_lora_rank
                else h * a * qk
            )
            kv = h * (self.kv_lora_rank + self.qk_pos_emb_head_dim) + self.kv_lora_rank
            kv += self.kv_lora_rank * a * (self.qk_head_dim + self.v_head_dim)
            return q + kv + a * self.v_head_dim * h
        kv = self.num_key_value_heads * hd
        params = 2 * h * a * hd + 2 * h * kv
        if self.model_type == "qwen2":
            params += a * hd + 2 * kv
        if self.model_type in ("qwen3", "qwen3_moe"):
            params += 2 * hd
        return params

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size  # SwiGLU: gate, up, down

    @property
    def expert_params(self) -> int:
        """All routed experts of the model (what expert parallelism shards)."""
        return self.moe_layers * self.num_experts * 3 * self.hidden_size * self.moe_ffn_hidden_size

    @property
    def moe_layer_dense_params(self) -> int:
        """A MoE layer's non-expert MLP part: router and shared experts."""
        return (
            self.hidden_size * self.num_experts
            + 3 * self.hidden_size * self.moe_shared_expert_intermediate_size
        )

    @property
    def layer_params(self) -> int:
        """Average per-layer weights that TP shards (all but routed experts): attention, MLP, 2 norms."""
        dense_layers = self.num_layers - self.moe_layers
        mlp = dense_layers * self.dense_mlp_params + self.moe_layers * self.moe_layer_dense_params
        return self.attention_params + 2 * self.hidden_size + mlp // max(1, self.num_layers)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def dense_params(self) -> int:
        """Everything but the routed experts."""
        emb = self.embedding_params * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * self.layer_params + emb + self.hidden_size

    @property
    def params(self) -> int:
        return self.dense_params + self.expert_params

    @property
    def active_params(self) -> int:
        """Weights one token passes through (MoE: top-k experts of each MoE layer)."""
        per_expert = 3 * self.hidden_size * self.moe_ffn_hidden_size
        return self.dense_params + self.moe_layers * self.moe_router_topk * per_expert

    @property
    def active_ffn(self) -> int:
        """FFN width a token passes through in an average layer (activation and workspace sizing)."""
        if not self.moe:
            return self.intermediate_size
        moe_ffn = self.moe_router_topk * self.moe_ffn_hidden_size + self.moe_shared_expert_intermediate_size
        dense = self.num_layers - self.moe_layers
        return (dense * self.intermediate_size + self.moe_layers * moe_ffn) // self.num_layers

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int) -> float:
        """vLLM KV cache per token on one NPU: GQA K and V per kv head (heads replicated when TP exceeds
        them); MLA caches the compressed latent plus the RoPE key, replicated on every TP rank."""
        if self.mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_pos_emb_head_dim) * dtype_bytes
        kv_heads = max(1, self.num_key_value_heads // tp)
        return 2 * self.num_layers * kv_heads * self.head_dim * dtype_bytes

    def describe(self) -> str:
        s = (
            f"{self.params / 1e9:.2f}B params ({self.model_type}, hidden {self.hidden_size}, "
            f"{self.num_layers} layers, {self.num_attention_heads} heads / {self.num_key_value_heads} kv, "
            f"head_dim {self.head_dim}, vocab {self.vocab_size}, ffn {self.intermediate_size}"
        )
        if self.moe:
            s += (
                f"; MoE {self.num_experts} experts top-{self.moe_router_topk} x ffn "
                f"{self.moe_ffn_hidden_size} in {self.moe_layers} layers, "
                f"{self.active_params / 1e9:.1f}B active"
            )
        if self.mla:
            s += f"; MLA kv_lora_rank {self.kv_lora_rank}, q_lora_rank {self.q_lora_rank}"
        return s + ")"


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


def resolve_arch(cfg: Config) -> tuple[Arch | None, list[str], str]:
    """Architecture from `model.arch` (explicit values win) filled in from model.path/config.json.

    Returns (arch or None, problems, source description)."""
    known = {f.name for f in fields(Arch)}
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
    arch = Arch(**kwargs)
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


def _arch_problems(arch: Arch, mt: str, head_dim_given: bool) -> list[str]:
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
