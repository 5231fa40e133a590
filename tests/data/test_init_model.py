"""`asp-npu init-model`: a local tokenizer + Qwen2 model that HF (and vLLM, see tests/rollout) load."""

from __future__ import annotations

import json

import pytest

from asp_npu.cli import main as cli_main
from asp_npu.data.init_model import SIZES, build_model, check_model_dir
from asp_npu.data.tasks import make_prompts
from asp_npu.errors import UserError

VLLM_CPU_HEAD_SIZES = {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}


def test_tiny_model_folder_loads_with_hf(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]) == (128, 4, 4)
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 32
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    assert cfg["vocab_size"] % 64 == 0 and cfg["vocab_size"] >= len(tok)
    assert (tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token) == ("<pad>", "<s>", "</s>", "<unk>")
    assert (
        cfg["eos_token_id"] == tok.eos_token_id
        and len({tok.pad_token_id, tok.eos_token_id, tok.bos_token_id}) == 3
    )
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    ids = torch.tensor([tok.encode("Count from 3 to 5.")])
    assert model(ids).logits.shape == (1, ids.shape[1], cfg["vocab_size"])
    assert check_model_dir(tiny_model_dir) == tiny_model_dir


def test_tokenizer_round_trips_and_lengths_track_items(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    for p in make_prompts("mix", 30, seed=7):
        for text in (p.text, p.ground_truth):
            assert tok.decode(tok.encode(text)) == text
    assert tok.tokenize("2026") == ["2", "0", "2", "6"]  # digits are single tokens, as in Qwen
    short = len(tok.encode(" ".join(str(i) for i in range(100, 110))))
    long = len(tok.encode(" ".join(str(i) for i in range(100, 200))))
    assert 9 < long / short < 11


@pytest.mark.parametrize("size", sorted(SIZES))
def test_sizes_have_vllm_cpu_head_sizes_and_expected_params(size):
    import torch

    shape = SIZES[size]
    assert shape["hidden_size"] // shape["num_attention_heads"] in VLLM_CPU_HEAD_SIZES
    assert shape["num_attention_heads"] % shape["num_key_value_heads"] == 0
    with torch.device("meta"):
        model = build_model(size, 1024, {"pad": 0, "bos": 1, "eos": 2})
    n = sum(p.numel() for p in model.parameters())
    lo, hi = {"tiny": (2e5, 2e6), "small": (1e7, 6e7)}[size]
    assert lo < n < hi


def test_cli_refuses_to_overwrite_and_writes_nothing_on_error(tmp_path, capsys):
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    assert cli_main(["init-model", "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert cli_main(["init-model", "--out", str(tmp_path / "m2"), "--size", "huge"]) == 2
    assert cli_main(["init-model", "--out", str(tmp_path / "no" / "such" / "dir")]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"] and (out / "keep.txt").exists()


def test_check_model_dir_errors(tmp_path, tiny_model_dir):
    with pytest.raises(UserError, match="does not exist"):
        check_model_dir(tmp_path / "none")
    d = tmp_path / "d"
    d.mkdir()
    with pytest.raises(UserError, match="no config.json"):
        check_model_dir(d)
    (d / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    with pytest.raises(UserError, match="no weights"):
        check_model_dir(d)


@pytest.mark.parametrize("arch,model_type,cls", [
    ("qwen3", "qwen3", "Qwen3ForCausalLM"), ("qwen3-moe", "qwen3_moe", "Qwen3MoeForCausalLM"),
    ("llama", "llama", "LlamaForCausalLM"),
])
def test_arch_builds_each_family_with_the_shared_tokenizer(tmp_path, capsys, arch, model_type, cls):
    from transformers import AutoTokenizer

    from asp_npu.arch import ModelDims

    out = tmp_path / arch
    assert cli_main(["init-model", "--out", str(out), "--arch", arch]) == 0
    assert arch in capsys.readouterr().out
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == model_type and cfg["architectures"] == [cls]
    assert cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]) in VLLM_CPU_HEAD_SIZES
    dims = ModelDims.from_hf_dir(out)
    assert dims.family == arch and dims.qkv_bias is False and dims.qk_norm == arch.startswith("qwen3")
    assert (dims.num_experts, dims.moe_router_topk) == ((8, 2) if arch == "qwen3-moe" else (0, 0))
    assert AutoTokenizer.from_pretrained(str(out)).tokenize("2026") == ["2", "0", "2", "6"]


def test_unknown_arch_is_one_line_exit_2(tmp_path, capsys):
    assert cli_main(["init-model", "--out", str(tmp_path / "m"), "--arch", "gpt5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown architecture 'gpt5' (known: qwen2, qwen3, qwen3-moe, llama)" in err[0]
    assert not (tmp_path / "m").exists()
