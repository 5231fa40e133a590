"""`asp-npu init-model`: a tokenizer and a random model built locally, saved as an HF folder.

Why: CI and the CPU demo must run with no hub access. The tokenizer is a byte-level BPE trained in
about a second on the synthetic tasks' text (digits split individually, as Qwen's tokenizer does,
so answer length in tokens follows the item count); the model is a randomly initialised HF model
of one of the families users train on Ascend (`--arch`: Qwen2/2.5 by default, Qwen3, Qwen3-MoE,
Llama 3). Any other local HF folder (a real download) is used the same way: vLLM, the trainer and
the tests only ever see "a folder with config.json, tokenizer and safetensors weights".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asp_npu.arch import ARCHS
from asp_npu.errors import UserError
from asp_npu.io import atomic_replace_dir

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# Head sizes are ones vLLM's CPU attention supports (32, 64, 80, 96, 112, 128, ...).
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,  # 2 layers learn to count but not to stop (docs/BENCHMARKS.md, issue 5)
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        vocab=512,
    ),
    "small": dict(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        vocab=1024,
    ),
}


def build_tokenizer(vocab_size: int, seed: int = 0):
    """Train a byte-level BPE on the tasks' text and wrap it as a `PreTrainedTokenizerFast`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from asp_npu.data.tasks import corpus_lines

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(seed=seed), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[4:],
        chat_template=CHAT_TEMPLATE,
        model_max_length=SIZES["small"]["max_position_embeddings"],
    )


ARCH_NAMES = tuple(ARCHS)
MOE_EXPERTS = 8  # qwen3-moe: routed experts per layer (top 2), each MLP a quarter of the dense width


def _hf_classes(arch: str) -> tuple[Any, Any]:
    import transformers as tf

    return {
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "qwen3-moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM),
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
    }[arch]


def build_model(size: str, vocab_size: int, special_ids: dict[str, int], seed: int = 0, arch: str = "qwen2"):
    import torch

    shape = dict(SIZES[size])
    shape.pop("vocab")
    config_cls, model_cls = _hf_classes(arch)
    extra: dict[str, Any] = {}
    if arch == "qwen2":
        extra["use_sliding_window"] = False
    if arch in ("qwen3", "qwen3-moe"):
        extra.update(use_sliding_window=False, attention_bias=False,
                     head_dim=shape["hidden_size"] // shape["num_attention_heads"])
    if arch == "qwen3-moe":
        extra.update(num_experts=MOE_EXPERTS, num_experts_per_tok=2, norm_topk_prob=True,
                     moe_intermediate_size=shape["intermediate_size"] // 4, router_aux_loss_coef=1e-3)
    config = config_cls(
        vocab_size=vocab_size,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=special_ids["pad"],
        bos_token_id=special_ids["bos"],
        eos_token_id=special_ids["eos"],
        dtype="float32",
        **shape,
        **extra,
    )
    torch.manual_seed(seed)
    model = model_cls(config)
    model.generation_config.eos_token_id = special_ids["eos"]
    model.generation_config.pad_token_id = special_ids["pad"]
    model.generation_config.bos_token_id = special_ids["bos"]
    return model


def build_model_dir(out: str | Path, size: str = "tiny", seed: int = 0, force: bool = False,
                    arch: str = "qwen2") -> Path:
    """Build tokenizer + random model of family `arch` into `out` (written atomically: all or nothing)."""
    if size not in SIZES:
        raise UserError(f"unknown model size '{size}' (known: {', '.join(SIZES)})")
    if arch not in ARCH_NAMES:
        raise UserError(f"unknown architecture '{arch}' (known: {', '.join(ARCH_NAMES)})")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise UserError(f"{out}: already exists and is not empty (use --force to replace it)")
    if not out.parent.exists():
        raise UserError(f"{out}: folder {out.parent} does not exist")
    tokenizer = build_tokenizer(SIZES[size]["vocab"], seed=seed)
    vocab = -(-len(tokenizer) // 64) * 64  # padded to a multiple of 64, as real checkpoints are
    ids = {"pad": tokenizer.pad_token_id, "bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id}
    model = build_model(size, vocab, ids, seed=seed, arch=arch)

    def fill(tmp: Path) -> None:
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)

    atomic_replace_dir(out, fill)  # a failure leaves a previous folder as it was and no temp behind
    return out


def read_model_config(folder: str | Path) -> dict[str, Any]:
    """`folder/config.json` as a JSON object, or one UserError (torn, undecodable, not an object,
    a size that is not a number: `model_folder.config_problem`)."""
    from asp_npu.data.model_folder import check_config

    return check_config(Path(folder), loadable=False)


def check_model_dir(path: str | Path) -> Path:
    """A usable HF model folder, or one UserError saying what is missing or corrupt: the folder is read
    (config schema, safetensors headers against the file sizes, the tokenizer loads; model_folder.py)."""
    from asp_npu.data.model_folder import check_config, check_tokenizer, check_weights

    p = Path(path)
    if not p.exists():
        raise UserError(f"model folder {p} does not exist (build one with `asp-npu init-model --out {p}`)")
    if not p.is_dir():
        raise UserError(f"model path {p} is not a folder")
    if not (p / "config.json").is_file():
        raise UserError(f"model folder {p} has no config.json")
    check_config(p)  # with model_type: the folder is about to be loaded
    if not any(p.glob("*.safetensors")) and not any(p.glob("*.bin")):
        raise UserError(f"model folder {p} has no weights (*.safetensors)")
    if not (p / "tokenizer.json").is_file() and not (p / "tokenizer_config.json").is_file():
        raise UserError(f"model folder {p} has no tokenizer")
    check_weights(p)
    check_tokenizer(p)
    return p


def count_params(folder: Path) -> int:
    from safetensors import safe_open

    total = 0
    for f in folder.glob("*.safetensors"):
        with safe_open(str(f), "np") as st:
            for k in st.keys():
                n = 1
                for d in st.get_slice(k).get_shape():
                    n *= d
                total += n
    return total
