"""Context parallelism: each sequence split over `context_parallel_size` ranks (MindSpeed-RL's
`context_parallel_size`, megatron's CP).

The split is megatron's: a micro-batch's sequence is cut into 2 x CP chunks and rank r keeps chunks r
and 2CP-1-r (`megatron.core.utils.get_batch_on_this_cp_rank`), so every rank gets the same share of
causal attention work; megatron's rotary embedding already picks the same chunks of the position
table (`get_pos_emb_on_this_cp_rank`), and its DDP and distributed optimizer reduce gradients over
the data x context parallel group. What megatron-core 0.16.1 leaves to Transformer Engine is the
attention across chunks: its local `DotProductAttention` refuses CP. `ContextParallelAttention` is
that class with keys and values all-gathered over the CP group (megatron's sequence-parallel gather:
all-gather forward, reduce-scatter backward, i.e. TE's "all_gather" CP communication) and the causal
mask built from the global positions of the local queries and the gathered keys. The softmax does not
care about the order of the keys, so the gathered chunks are never reordered.

The loss is token level (normalised by the minibatch's token count), so each rank's loss over its
own tokens sums to the full loss; per-token outputs (log-probs for `compute_logprobs`) are gathered
back to whole sequences by `gather_sequence`.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.transformer.dot_product_attention import DotProductAttention

SPLIT_KEYS = ("input_ids", "labels", "mask", "adv", "behav", "position_ids")


def chunk_positions(rank: int, cp: int, local_len: int) -> torch.Tensor:
    """Global sequence positions of the `local_len` tokens CP rank `rank` holds (chunks r, 2CP-1-r)."""
    c = local_len // 2
    first = torch.arange(rank * c, (rank + 1) * c)
    second = torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)
    return torch.cat([first, second])


def gathered_positions(cp: int, local_len: int) -> torch.Tensor:
    """Global positions of the keys after an all-gather over the CP group (rank-major)."""
    return torch.cat([chunk_positions(r, cp, local_len) for r in range(cp)])


def split_micro_batch(mb: dict[str, torch.Tensor], cp: int, rank: int) -> dict[str, torch.Tensor]:
    """This CP rank's chunks of every [batch, seq] tensor of a micro-batch (seq divisible by 2 x CP);
    per-sample fields (`index`, `lengths`) stay whole."""
    from megatron.core.utils import get_batch_on_this_cp_rank

    if cp == 1:
        return mb
    seq = int(mb["input_ids"].shape[1])
    if seq % (2 * cp):
        raise ValueError(f"context parallel split needs a sequence length divisible by 2 x CP = {2 * cp}, "
                         f"got {seq}")
    split = get_batch_on_this_cp_rank({k: mb[k] for k in SPLIT_KEYS if k in mb},
                                      cp_group=parallel_state.get_context_parallel_group())
    return {**mb, **split}


def gather_sequence(local: torch.Tensor) -> torch.Tensor:
    """[batch, seq/CP] per-token values of this CP rank -> [batch, seq] in sequence order (all ranks)."""
    import torch.distributed as dist

    cp = parallel_state.get_context_parallel_world_size()
    if cp == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(cp)]
    dist.all_gather(parts, local.contiguous(), group=parallel_state.get_context_parallel_group())
    gathered = torch.cat(parts, dim=1)
    order = torch.argsort(gathered_positions(cp, int(local.shape[1])))
    return gathered.index_select(1, order.to(gathered.device))


class ContextParallelAttention(DotProductAttention):
    """megatron's local core attention over a context-parallel sequence: K and V of every CP rank,
    masked by global positions. Inputs are [s/CP, b, heads, head_dim] as megatron passes them."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        local = copy.copy(config)
        local.context_parallel_size = 1  # DotProductAttention's own guard; the gather below does CP
        super().__init__(local, *args, **kwargs)
        self.cp_group = parallel_state.get_context_parallel_group()
        self.cp = parallel_state.get_context_parallel_world_size()
        self.cp_rank = parallel_state.get_context_parallel_rank()

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: Any = None,
                attention_bias: Any = None, packed_seq_params: Any = None) -> torch.Tensor:
        from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

        if self.cp == 1:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias,
                                   packed_seq_params)
        local_len = int(query.shape[0])
        key = gather_from_sequence_parallel_region(key, True, group=self.cp_group)
        value = gather_from_sequence_parallel_region(value, True, group=self.cp_group)
        q_pos = chunk_positions(self.cp_rank, self.cp, local_len).to(query.device)
        k_pos = gathered_positions(self.cp, local_len).to(query.device)
        causal = (k_pos.unsqueeze(0) > q_pos.unsqueeze(1)).view(1, 1, local_len, -1)  # True = masked
        return super().forward(query, key, value, causal, attn_mask_type, attention_bias, packed_seq_params)
