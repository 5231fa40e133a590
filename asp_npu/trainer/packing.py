"""Packed sequences in the trainer (MindSpeed-RL's and verl's `use_remove_padding`).

Right-padded micro-batches spend forward/backward on padding: a long-tailed minibatch pads every
row of a micro-batch to its longest sample. Packed, a micro-batch is one token stream
`[1, sum(lengths)]` with the sequence boundaries in megatron-core's `PackedSeqParams` (`qkv_format`
"thd", `cu_seqlens` = cumulative lengths) and position ids restarting at 0 for every sequence;
megatron's rotary embedding already honours `cu_seqlens` (`_apply_rotary_pos_emb_thd`), so what must
change is the core attention, which must not let a token attend to an earlier sequence of the stream.
megatron-core's local `DotProductAttention` refuses `packed_seq_params` (that is Transformer Engine's
job); `PackedAttention` is that class run sequence by sequence over the stream (each with its own
causal mask: the block-diagonal causal mask of the stream, without computing the blocks it masks).
On Ascend MindSpeed's adaptor gives the core attention variable-length flash attention over the
same `cu_seqlens`, so the swap is a device choice (`device.DeviceSpec.packed_split_attention`).

Only the model's inputs are packed: the loss-side tensors (`mask`, `adv`, `behav`) stay in the
`[batch, seq]` layout the loss uses, and `unpack` scatters the per-token log-probs back to it, so
the loss, its normalisation and `compute_logprobs` see exactly what the padded path gives them.
Data-parallel ranks are balanced by real tokens (`batching.shard_for_dp`); with `use_dynamic_bsz` a
micro-batch holds up to `ppo_max_token_len_per_gpu` real tokens (first-fit decreasing), otherwise
`micro_batch_size` samples as in the padded path. Context parallelism is refused with packing (the
CP split would have to cut every packed sequence into its own 2 x CP chunks, Transformer Engine's
thd CP), and so are MoE models (the allgather dispatcher wants equal token blocks on every DP rank).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention


class _Sized(Protocol):
    @property
    def length(self) -> int: ...


def token_groups(samples: Sequence[_Sized], max_token_len: int) -> list[list[int]]:
    """Indices of `samples` per micro-batch: first-fit decreasing into bins of `max_token_len` real
    tokens (a longer sample gets a bin of its own); deterministic."""
    order = sorted(range(len(samples)), key=lambda i: (-samples[i].length, i))
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        n = samples[i].length
        slot = next((b for b, load in enumerate(loads) if load + n <= max_token_len), None)
        if slot is None:
            bins.append([i])
            loads.append(n)
        else:
            bins[slot].append(i)
            loads[slot] += n
    return bins


def packed_micro_batches(samples: Sequence[Any], micro_batch_size: int, max_token_len: int = 0,
                         pad_multiple: int = 1) -> list[dict[str, torch.Tensor]]:
    """Micro-batches of `samples` (batching.Sample) as packed streams: `micro_batch_size` samples each in
    the padded path's order, or up to `max_token_len` real tokens each (use_dynamic_bsz)."""
    from asp_npu.trainer.batching import make_micro_batches  # the loss-side [batch, seq] tensors

    if max_token_len:
        groups = [[samples[i] for i in g] for g in token_groups(samples, max_token_len)]
    else:
        ordered = sorted(samples, key=lambda s: (-s.length, s.index))
        groups = [ordered[k:k + micro_batch_size] for k in range(0, len(ordered), micro_batch_size)]
    return [pack(mb, pad_multiple) for g in groups for mb in make_micro_batches(list(g), len(g))]


def pack(mb: dict[str, torch.Tensor], pad_multiple: int = 1) -> dict[str, torch.Tensor]:
    """A right-padded micro-batch with its model inputs (`input_ids`, `labels`, `position_ids`) packed
    into one `[1, T]` stream, T = real tokens rounded up to `pad_multiple` (sequence parallelism); the
    tail is one more sequence, never read back. Adds `cu_seqlens` (int32) and `unpack_index` (where
    each real token of the stream sits in the flattened `[batch, seq]` layout)."""
    b, s = mb["input_ids"].shape
    lengths = mb["lengths"].to(torch.long)
    total = int(lengths.sum())
    padded = -(-total // pad_multiple) * pad_multiple
    rows = torch.repeat_interleave(torch.arange(b), lengths)
    cols = torch.cat([torch.arange(int(n)) for n in lengths])
    flat = rows * s + cols
    bounds = [0, *torch.cumsum(lengths, 0).tolist()] + ([padded] if padded > total else [])
    out = dict(mb)
    for key in ("input_ids", "labels"):
        stream = torch.zeros(1, padded, dtype=mb[key].dtype)
        stream[0, :total] = mb[key].reshape(-1)[flat]
        out[key] = stream
    out["position_ids"] = torch.cat([cols, torch.arange(padded - total)]).unsqueeze(0)
    out["cu_seqlens"] = torch.tensor(bounds, dtype=torch.int32)
    out["unpack_index"] = flat
    return out


def is_packed(mb: dict[str, torch.Tensor]) -> bool:
    return "cu_seqlens" in mb


def seq_params(mb: dict[str, torch.Tensor]) -> Any:
    """megatron's PackedSeqParams for a packed micro-batch (None for a padded one)."""
    if not is_packed(mb):
        return None
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = mb["cu_seqlens"]
    longest = int((cu[1:] - cu[:-1]).max())
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                           max_seqlen_q=longest, max_seqlen_kv=longest)


def unpack(values: torch.Tensor, mb: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-token values of a packed stream `[1, T]` -> the micro-batch's `[batch, seq]` layout (zeros
    at padding); differentiable. A padded micro-batch's values pass through unchanged."""
    if not is_packed(mb):
        return values
    b, s = mb["mask"].shape
    idx = mb["unpack_index"]
    flat = values.new_zeros(b * s).index_copy(0, idx, values.reshape(-1)[:idx.numel()])
    return flat.view(b, s)


def block_causal_mask(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """[1, 1, T, T] boolean mask (True = masked) of a packed stream: causal within each sequence, no
    attention across sequences. `PackedAttention` computes the same thing block by block."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.long)
    seg = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    pos = torch.arange(seg.numel())
    masked = (seg.unsqueeze(0) != seg.unsqueeze(1)) | (pos.unsqueeze(0) > pos.unsqueeze(1))
    return masked.view(1, 1, seg.numel(), seg.numel())


class PackedAttention(DotProductAttention):
    """megatron's local core attention over a packed ("thd") stream: each sequence of `cu_seqlens`
    attends causally to itself only. Inputs are [T, heads, head_dim] as megatron passes them when
    packed; padded micro-batches ([s, b, heads, head_dim]) go to the parent unchanged."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: Any = None,
                attention_bias: Any = None, packed_seq_params: Any = None) -> torch.Tensor:
        if packed_seq_params is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias)
        bounds = packed_seq_params.cu_seqlens_q.tolist()
        outs = []
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            q, k, v = (x[lo:hi].unsqueeze(1) for x in (query, key, value))  # [s_i, 1, heads, dim]
            outs.append(super().forward(q, k, v, None, attn_mask_type, attention_bias))
        return torch.cat(outs, dim=0)  # [T, 1, heads x dim]
