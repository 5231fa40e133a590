"""Which optimizer state megatron-core's HybridDeviceOptimizer keeps on the host, tensor by tensor
(pure arithmetic, no torch: `check` and the layout search call it for every candidate).

megatron-core 0.16.1 (`optimizer/cpu_offloading/hybrid_optimizer.py`, `_get_sub_optimizer_param_groups`)
walks the tensors it is handed in order and moves each one whole to the host while the elements moved
so far are below `offload_fraction` x the rank's total: the tensor that crosses the threshold goes
whole, so the host share is at least the fraction, by up to one tensor (on a small model one
embedding-sized tensor is a sixth of the parameters). With the distributed optimizer those tensors are
this DP rank's shards (`distrib_optimizer.py`): the DDP buffer lays the stage's parameters out in
reverse `named_parameters` order (each start aligned to 64 elements, a tied embedding shared across
pipeline stages in a bucket of its own, each bucket padded to a multiple of lcm(DP, 128)); each DP rank
owns one contiguous 1/DP of every bucket; the optimizer's parameter groups list the weight-decayed
tensors first, then those without weight decay (biases and 1-D norms: megatron's `wd_mult=0` group),
each in buffer order. Routed experts (megatron's expert-parallel buffers) have an optimizer, and a
threshold, of their own.

Bytes (`OptimizerBytes`): per offloaded element the host keeps an fp32 master copy, exp_avg, exp_avg_sq
and a pinned fp32 gradient copy (16 bytes); the device keeps both moments of the others (8 bytes) and,
for 16-bit models, the fp32 master shard of every element, offloaded or not (the distributed optimizer
keeps it; megatron copies the host's result back into it after each step). fp32 models step their own
weights. Each tensor shard also has a 4-byte Adam step counter on its side.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from asp_npu.arch import ModelDims

HOST_BYTES = 16  # fp32 master + exp_avg + exp_avg_sq + pinned fp32 gradient, per offloaded element
MOMENT_BYTES = 8  # exp_avg + exp_avg_sq kept on the device
MASTER_BYTES = 4  # 16-bit models: the fp32 master shard the distributed optimizer keeps on the device
STEP_BYTES = 4  # Adam's step counter, one per tensor shard


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor of a trainer rank (after the TP / EP split), as megatron registers it."""

    name: str
    numel: int
    decay: bool = True  # False: a bias or 1-D tensor (megatron's wd_mult=0 group, handed over second)
    own_bucket: bool = False  # a tied embedding/output shared across pipeline stages


@dataclass(frozen=True)
class Split:
    """One DP rank's optimizer shard: elements (and tensor shards) stepped on the device / on the host."""

    device: int
    host: int
    device_tensors: int
    host_tensors: int

    def device_bytes(self, master: bool) -> int:
        return (MASTER_BYTES * (self.device + self.host) if master else 0) + MOMENT_BYTES * self.device

    def host_bytes(self) -> int:
        return HOST_BYTES * self.host

    def measured_like(self, master: bool) -> dict[str, int]:
        """Device and host bytes as `TrainerWorker.optimizer_bytes()` counts them (step counters too)."""
        return {"device": self.device_bytes(master) + STEP_BYTES * self.device_tensors,
                "host": self.host_bytes() + STEP_BYTES * self.host_tensors}


def layer_tensors(arch: ModelDims, tp: int, moe: bool) -> list[ParamTensor]:
    """One decoder layer's non-routed tensors in megatron's local-spec order (the input norm, attention:
    linear_proj then linear_qkv (+ bias, q/k norms), the pre-MLP norm, the MLP or router + shared
    experts). MLA attention (sized by `check` only) counts as one tensor."""
    h, hd = arch.hidden_size, arch.head_dim
    out = [ParamTensor("input_layernorm", h, decay=False)]
    if arch.mla:
        out.append(ParamTensor("self_attention", arch.attention_params // tp))
    else:
        q, kv = arch.num_attention_heads * hd, arch.num_key_value_heads * hd
        out += [ParamTensor("linear_proj", h * q // tp), ParamTensor("linear_qkv", (q + 2 * kv) * h // tp)]
        if arch.qkv_bias:
            out.append(ParamTensor("linear_qkv.bias", (q + 2 * kv) // tp, decay=False))
        if arch.qk_norm:
            out += [ParamTensor("q_layernorm", hd, decay=False), ParamTensor("k_layernorm", hd, decay=False)]
    out.append(ParamTensor("pre_mlp_layernorm", h, decay=False))
    if not moe:
        f = arch.intermediate_size
        return out + [ParamTensor("linear_fc1", 2 * f * h // tp), ParamTensor("linear_fc2", h * f // tp)]
    out.append(ParamTensor("router", arch.num_experts * h))
    fs = arch.moe_shared_expert_intermediate_size
    if fs:
        out += [ParamTensor("shared_experts.linear_fc1", 2 * fs * h // tp),
                ParamTensor("shared_experts.linear_fc2", h * fs // tp)]
    return out


def expert_tensors(arch: ModelDims, ep: int, etp: int) -> list[ParamTensor]:
    """One MoE layer's local routed experts (num_experts / EP), each fc1 and fc2 split over expert TP."""
    h, fe = arch.hidden_size, arch.moe_ffn_hidden_size
    per = [ParamTensor("expert.linear_fc1", 2 * fe * h // etp),
           ParamTensor("expert.linear_fc2", h * fe // etp)]
    return per * max(1, arch.num_experts // ep)


def stage_tensors(arch: ModelDims, layers: range, tp: int, ep: int, etp: int, first: bool, last: bool,
                  pp: int) -> tuple[list[ParamTensor], list[ParamTensor]]:
    """A pipeline stage's (dense, routed expert) tensors on one TP/EP rank, in `named_parameters`
    order; the vocabulary is padded up to a multiple of TP, as the trainer builds it."""
    vocab = -(-arch.vocab_size // tp) * arch.hidden_size
    shared = arch.tie_word_embeddings and pp > 1
    dense: list[ParamTensor] = [ParamTensor("embedding", vocab, own_bucket=shared)] if first else []
    experts: list[ParamTensor] = []
    leading_dense = arch.num_layers - arch.moe_layers
    for i in layers:
        moe = arch.moe and i >= leading_dense
        dense += layer_tensors(arch, tp, moe)
        experts += expert_tensors(arch, ep, etp) if moe else []
    if last:
        dense.append(ParamTensor("final_layernorm", arch.hidden_size, decay=False))
        if pp > 1 or not arch.tie_word_embeddings:
            dense.append(ParamTensor("output_layer", vocab, own_bucket=shared))
    return dense, experts


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def buffer_layout(tensors: Sequence[ParamTensor],
                  dp: int) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """megatron's DDP buffer with the distributed optimizer: (starts, ends) of the tensors in buffer
    order (reverse registration order) and the padded buckets."""
    div = math.lcm(dp, 128)
    starts: list[int] = []
    ends: list[int] = []
    buckets: list[tuple[int, int]] = []
    cursor = bucket_start = open_params = 0
    for t in reversed(tensors):
        start = _pad(cursor, 64)
        if t.own_bucket and open_params:
            buckets.append((bucket_start, _pad(start, div)))
            start = bucket_start = buckets[-1][1]
        starts.append(start)
        ends.append(start + t.numel)
        cursor, open_params = ends[-1], open_params + 1
        if t.own_bucket:
            buckets.append((bucket_start, _pad(cursor, div)))
            cursor = bucket_start = buckets[-1][1]
            open_params = 0
    if open_params:
        buckets.append((bucket_start, _pad(cursor, div)))
    return starts, ends, buckets


def dp_shards(tensors: Sequence[ParamTensor], dp: int) -> list[list[tuple[ParamTensor, int]]]:
    """Each DP rank's (tensor, shard elements) in the order the distributed optimizer hands them to
    HybridDeviceOptimizer: weight-decayed tensors first, then the others, each in buffer order."""
    order = list(reversed(tensors))
    starts, ends, buckets = buffer_layout(tensors, dp)
    out = []
    for r in range(dp):
        mine: list[tuple[ParamTensor, int]] = []
        for b0, b1 in buckets:
            per = (b1 - b0) // dp
            lo, hi = b0 + r * per, b0 + (r + 1) * per
            i = bisect.bisect_right(ends, lo)  # buffer positions grow with the index: ends are sorted
            while i < len(order) and starts[i] < hi:
                n = min(ends[i], hi) - max(starts[i], lo)
                if n > 0:
                    mine.append((order[i], n))
                i += 1
        out.append([x for x in mine if x[0].decay] + [x for x in mine if not x[0].decay])
    return out


def hybrid_split(numels: Sequence[int], fraction: float) -> Split:
    """megatron's rule on tensors of `numels` elements, in order: offload each whole tensor while the
    offloaded elements are below fraction x the total."""
    threshold = sum(numels) * fraction
    host = host_tensors = 0
    for n in numels:
        if host >= threshold:
            break
        host, host_tensors = host + n, host_tensors + 1
    return Split(sum(numels) - host, host, len(numels) - host_tensors, host_tensors)


def rank_splits(tensors: Sequence[ParamTensor], dp: int, fraction: float) -> list[Split]:
    """The device/host split of every DP rank's shard of `tensors` (one optimizer: one threshold)."""
    return [hybrid_split([n for _, n in shard], fraction) for shard in dp_shards(tensors, dp)]
