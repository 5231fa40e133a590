"""Model-family and expert-parallel configuration: refused with one line (exit 2) before anything starts."""

from __future__ import annotations

import json

import torch

from asp_npu.arch import MLA_MISSING, ModelDims
from asp_npu.cli import main as cli_main
from asp_npu.config import Config, validate
from asp_npu.core.layout import ParallelLayout, layout_problems
from asp_npu.trainer.convert import hf_to_megatron

MOE = ModelDims(hidden_size=8, intermediate_size=6, num_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=2, vocab_size=7,
                rms_norm_eps=1e-6, rope_theta=1e4, max_position_embeddings=16,
                tie_word_embeddings=False, model_type="qwen3_moe", num_experts=4, moe_router_topk=2,
                moe_ffn_hidden_size=4)


def _folder(tmp_path, **hf) -> str:
    (tmp_path / "config.json").write_text(json.dumps(hf))
    return str(tmp_path)


def test_unknown_architecture_is_one_line_exit_2(capsys):
    rc = cli_main(["train", "--config", "configs/cpu_tiny.yaml", "model.architecture=gpt5",
                   "model.path=/nonexistent/m"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "model.architecture: 'gpt5' is not one of qwen2, qwen3, qwen3-moe, llama" in err[0]


def test_ep_not_dividing_the_experts_is_one_line_exit_2(tmp_path, capsys):
    path = _folder(tmp_path, model_type="qwen3_moe", num_experts=8)
    rc = cli_main(["train", "--config", "configs/cpu_tiny.yaml", f"model.path={path}",
                   "actor_config.data_parallel_size=3", "actor_config.expert_model_parallel_size=3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "expert_model_parallel_size=3 does not divide the 8 experts" in err[0]


def test_deepseek_v3_says_what_is_missing_and_why(tmp_path):
    cfg = Config()
    cfg.model.path = _folder(tmp_path, model_type="deepseek_v3", n_routed_experts=256)
    assert any(MLA_MISSING in p and "Transformer Engine" in p for p in validate(cfg))
    cfg = Config()
    cfg.model.arch.multi_latent_attention = True  # what a MindSpeed-RL deepseekv3 model config imports as
    assert any(p.startswith("model.arch.multi_latent_attention: DeepSeek-V3") for p in validate(cfg))


def test_expert_parallel_layout_rules():
    assert layout_problems(MOE, 1, 1, 2, 2, ep=2) == []
    assert any("does not divide the 4 experts" in p for p in layout_problems(MOE, 1, 1, 3, 3, ep=3))
    assert any("= 4 does not divide TP x CP x DP = 2" in p for p in layout_problems(MOE, 1, 1, 2, 2, ep=4))
    dense = ModelDims(**{**MOE.__dict__, "model_type": "qwen2", "num_experts": 0})
    assert any("needs a MoE model" in p for p in layout_problems(dense, 1, 1, 2, 2, ep=2))
    cfg = Config()
    cfg.model.arch.num_experts, cfg.actor_config.tensor_model_parallel_size = 8, 2
    assert any("sequence_parallel: must be true for a MoE model" in p for p in validate(cfg))


def _moe_hf(d: ModelDims) -> dict[str, torch.Tensor]:
    h = d.hidden_size
    sd = {"model.embed_tokens.weight": torch.randn(d.vocab_size, h), "model.norm.weight": torch.randn(h),
          "lm_head.weight": torch.randn(d.vocab_size, h)}
    for i in range(d.num_layers):
        p = f"model.layers.{i}."
        heads = d.num_attention_heads
        for n, rows in (("q", heads), ("k", d.num_key_value_heads), ("v", d.num_key_value_heads)):
            sd[p + f"self_attn.{n}_proj.weight"] = torch.randn(rows * d.head_dim, h)
        sd[p + "self_attn.o_proj.weight"] = torch.randn(h, d.num_attention_heads * d.head_dim)
        sd[p + "self_attn.q_norm.weight"] = torch.full((d.head_dim,), 1.0 + i)
        sd[p + "self_attn.k_norm.weight"] = torch.full((d.head_dim,), 2.0 + i)
        sd[p + "mlp.gate.weight"] = torch.randn(d.num_experts, h)
        for e in range(d.num_experts):  # expert e's weights hold the value e
            for n, shape in (("gate", (4, h)), ("up", (4, h)), ("down", (h, 4))):
                sd[p + f"mlp.experts.{e}.{n}_proj.weight"] = torch.full(shape, float(e))
        sd[p + "input_layernorm.weight"] = torch.randn(h)
        sd[p + "post_attention_layernorm.weight"] = torch.randn(h)
    return sd


def test_moe_experts_split_over_expert_parallel_ranks_and_qk_norms_replicated():
    hf = _moe_hf(MOE)
    for ep_rank in range(2):
        for tp_rank in range(2):
            sd = hf_to_megatron(hf, MOE, ParallelLayout(2, 1, 2, ep=2), tp_rank, 0, ep_rank)
            m = "decoder.layers.1."
            assert torch.equal(sd[m + "self_attention.q_layernorm.weight"], torch.full((2,), 2.0))
            assert torch.equal(sd[m + "self_attention.k_layernorm.weight"], torch.full((2,), 3.0))
            assert m + "self_attention.linear_qkv.bias" not in sd  # Qwen3: no q/k/v bias
            assert torch.equal(sd[m + "mlp.router.weight"], hf["model.layers.1.mlp.gate.weight"])
            local = sorted(k for k in sd if ".local_experts." in k and k.startswith(m))
            assert len(local) == 4  # 2 experts x (fc1, fc2)
            for j in range(2):
                fc1 = sd[m + f"mlp.experts.local_experts.{j}.linear_fc1.weight"]
                assert fc1.shape == (4, 8)  # [gate half; up half] of this TP rank
                assert torch.all(fc1 == 2 * ep_rank + j)


def test_expert_tensor_parallel_one_keeps_whole_experts():
    """MindSpeed's moe_tp_extend_ep as megatron sees it: ETP=1, so each expert is whole on its EP rank."""
    hf = _moe_hf(MOE)
    sd = hf_to_megatron(hf, MOE, ParallelLayout(2, 1, 1, ep=2, etp=1), 1, 0, 1, etp_rank=0)
    fc1 = sd["decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight"]
    assert fc1.shape == (8, 8) and torch.all(fc1 == 2)  # expert 2, gate + up unsplit
    proj = sd["decoder.layers.0.self_attention.linear_proj.weight"]
    assert proj.shape[1] == MOE.num_attention_heads * MOE.head_dim // 2  # attention still TP-split
