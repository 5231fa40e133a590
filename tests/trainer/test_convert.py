"""HF <-> megatron layout conversion (pure tensor logic, no process group)."""

from __future__ import annotations

import torch

from asp_npu.arch import ModelDims
from asp_npu.core.layout import ParallelLayout
from asp_npu.trainer.convert import _qkv_split, hf_to_megatron, stage_layers

DIMS = ModelDims(hidden_size=8, intermediate_size=6, num_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=2, vocab_size=7,
                 rms_norm_eps=1e-6, rope_theta=1e4, max_position_embeddings=16,
                 tie_word_embeddings=False)


def _hf_state(d: ModelDims) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    h, hd = d.hidden_size, d.head_dim
    sd = {"model.embed_tokens.weight": torch.randn(d.vocab_size, h, generator=g),
          "model.norm.weight": torch.randn(h, generator=g),
          "lm_head.weight": torch.randn(d.vocab_size, h, generator=g)}

    def tagged(heads: int, base: float) -> torch.Tensor:
        return base + torch.arange(heads).repeat_interleave(hd)[:, None].float().expand(-1, h)

    for i in range(d.num_layers):
        p = f"model.layers.{i}."
        # q rows tagged with their head index so the interleaving can be read off
        sd[p + "self_attn.q_proj.weight"] = tagged(d.num_attention_heads, 0)
        sd[p + "self_attn.k_proj.weight"] = tagged(d.num_key_value_heads, 100)
        sd[p + "self_attn.v_proj.weight"] = tagged(d.num_key_value_heads, 200)
        for n in ("q", "k", "v"):
            sd[p + f"self_attn.{n}_proj.bias"] = sd[p + f"self_attn.{n}_proj.weight"][:, 0].clone()
        sd[p + "self_attn.o_proj.weight"] = torch.randn(h, d.num_attention_heads * hd, generator=g)
        sd[p + "mlp.gate_proj.weight"] = torch.randn(d.intermediate_size, h, generator=g)
        sd[p + "mlp.up_proj.weight"] = torch.randn(d.intermediate_size, h, generator=g)
        sd[p + "mlp.down_proj.weight"] = torch.randn(h, d.intermediate_size, generator=g)
        sd[p + "input_layernorm.weight"] = torch.randn(h, generator=g)
        sd[p + "post_attention_layernorm.weight"] = torch.randn(h, generator=g)
    return sd


def test_qkv_is_interleaved_per_query_group_and_split_by_whole_groups():
    hf = _hf_state(DIMS)
    shards = [hf_to_megatron(hf, DIMS, ParallelLayout(2, 1, 1), r, 0) for r in range(2)]
    # rank r holds query group r: [q heads 2r, 2r+1; k head r; v head r], head_dim rows each
    for r, sd in enumerate(shards):
        rows = sd["decoder.layers.0.self_attention.linear_qkv.weight"][:, 0].tolist()
        assert rows == [2 * r] * 2 + [2 * r + 1] * 2 + [100 + r] * 2 + [200 + r] * 2
    full = torch.cat([sd["decoder.layers.0.self_attention.linear_qkv.weight"] for sd in shards])
    q, k, v = _qkv_split(full, DIMS)
    assert torch.equal(q, hf["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(k, hf["model.layers.0.self_attn.k_proj.weight"])
    assert torch.equal(v, hf["model.layers.0.self_attn.v_proj.weight"])


def test_gate_up_fusion_row_split_and_vocab_padding():
    hf = _hf_state(DIMS)
    shards = [hf_to_megatron(hf, DIMS, ParallelLayout(2, 1, 1), r, 0) for r in range(2)]
    gate, up = hf["model.layers.1.mlp.gate_proj.weight"], hf["model.layers.1.mlp.up_proj.weight"]
    for r, sd in enumerate(shards):
        fc1 = sd["decoder.layers.1.mlp.linear_fc1.weight"]
        assert torch.equal(fc1, torch.cat([gate[3 * r:3 * r + 3], up[3 * r:3 * r + 3]]))
        assert torch.equal(sd["decoder.layers.1.mlp.linear_fc2.weight"],
                           hf["model.layers.1.mlp.down_proj.weight"][:, 3 * r:3 * r + 3])
    emb = torch.cat([sd["embedding.word_embeddings.weight"] for sd in shards])
    assert emb.shape[0] == 8 and torch.equal(emb[:7], hf["model.embed_tokens.weight"]) and not emb[7].any()


def test_pipeline_stages_hold_consecutive_layers_with_local_names():
    hf = _hf_state(DIMS)
    first = hf_to_megatron(hf, DIMS, ParallelLayout(1, 2, 1), 0, 0)
    last = hf_to_megatron(hf, DIMS, ParallelLayout(1, 2, 1), 0, 1)
    assert list(stage_layers(DIMS, ParallelLayout(1, 2, 1), 1)) == [2, 3]
    assert "embedding.word_embeddings.weight" in first and "output_layer.weight" not in first
    assert "output_layer.weight" in last and "embedding.word_embeddings.weight" not in last
    assert torch.equal(last["decoder.layers.0.input_layernorm.weight"],
                       hf["model.layers.2.input_layernorm.weight"])


def test_uneven_pipeline_stages_hold_their_layer_counts():
    hf = _hf_state(DIMS)
    lay = ParallelLayout(1, 2, 1, stages=(1, 3))
    assert [list(stage_layers(DIMS, lay, r)) for r in range(2)] == [[0], [1, 2, 3]]
    first, last = hf_to_megatron(hf, DIMS, lay, 0, 0), hf_to_megatron(hf, DIMS, lay, 0, 1)
    assert {k.split(".")[2] for k in first if k.startswith("decoder.layers.")} == {"0"}
    assert {k.split(".")[2] for k in last if k.startswith("decoder.layers.")} == {"0", "1", "2"}
    assert torch.equal(last["decoder.layers.0.input_layernorm.weight"],
                       hf["model.layers.1.input_layernorm.weight"])
    assert lay.pipeline_layout() == [["embedding", "decoder"], ["decoder"] * 3 + ["loss"]]
