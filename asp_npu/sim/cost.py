"""Cost model of the simulated cluster: decode steps, prefill, trainer tokens, refresh and switching.

Decode (continuous batching, one token per running sequence per step; vLLM semantics):
`step_s = a + b * running + c * kv_tokens`, with `kv_tokens` the sum of current contexts. Between two
events the batch is fixed and the KV grows by `running` tokens per step, so `k` steps take exactly
`k*(a + b*n + c*kv) + c*n*k*(k-1)/2` seconds -- the simulator jumps from event to event in closed form
instead of stepping tokens. Prefill: `prefill_s_per_token` per prompt token, paid when a sequence joins.

Trainer: `train_step_s` wall seconds per step (the optimizer update and launches, whatever the
tokens) plus `train_s_per_token` device-seconds per sequence token (prompt + response) for old-logprob,
reference forward and the update together, split over the trainer's data-parallel ranks either
balanced (verl `balance_batch` Karmarkar-Karp + dynamic batch size; our trainer) or padded (fixed
micro-batches padded to their longest sequence, samples dealt to ranks in order: MindSpeed-RL default).
Our trainer computes its real tokens when it packs (`train_packed`, actor_config.use_remove_padding),
else its length-sorted micro-batches padded to their longest sample (`_sorted_padded_loads`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SimCost:
    """All cost numbers of a preset (docs/simulator.md gives each one's public source)."""

    decode_a: float = 0.0535  # s per decode step, fixed part
    decode_b: float = 0.00035  # s per running sequence per step
    decode_c: float = 0.0  # s per KV token per step (attention reads the cache)
    prefill_s_per_token: float = 0.0
    train_s_per_token: float = 1e-3  # trainer device-seconds per token (logprob + ref + update)
    train_step_s: float = 0.0  # trainer wall seconds per step on top of its tokens (optimizer, launches)
    train_dp_devices: int = 1  # devices per trainer data-parallel rank (TP x PP of the trainer)
    micro_batch_size: int = 1  # padded trainer: samples per micro-batch
    # asp-npu's own trainer (the modes that are not `trainer_padded`): packed micro-batches
    # (actor_config.use_remove_padding) compute their real tokens; unpacked, length-sorted micro-batches of
    # `micro_batch_size` samples (or of <= `train_max_token_len` padded tokens: use_dynamic_bsz) compute
    # every row padded to the micro-batch's longest sample
    train_packed: bool = True
    train_max_token_len: int = 0
    refresh_s: float = 1.0  # weight refresh (disaggregated): trainer -> all instances
    to_train_s: float = (
        0.0  # colocated switch rollout -> train (offload KV/weights, onload optimizer, reshard)
    )
    to_infer_s: float = 0.0  # colocated switch train -> rollout (reshard to inference TP, offload, onload)
    # rollout and trainer sharing cores (asp_npu/sim/contention.py): decode steps / trainer steps take
    # this many times longer while the other side is busy (measured by `asp-npu calibrate`; 1 = apart)
    share_decode_slowdown: float = 1.0
    share_train_slowdown: float = 1.0
    # a colocated mode's instances always decode at once on neighbouring cores: each decode step takes
    # this many times longer than one instance's alone (caches, memory bandwidth; `asp-npu calibrate`)
    colocated_decode_slowdown: float = 1.0

    def validate(self) -> list[str]:
        bad = []
        for name in (
            "decode_a",
            "decode_b",
            "decode_c",
            "prefill_s_per_token",
            "refresh_s",
            "to_train_s",
            "to_infer_s",
            "train_step_s",
        ):
            if not getattr(self, name) >= 0:
                bad.append(f"cost.{name} must be >= 0 (got {getattr(self, name)})")
        if not self.decode_a > 0 and not self.decode_b > 0:
            bad.append("cost.decode_a or cost.decode_b must be > 0")
        if not self.train_s_per_token > 0:
            bad.append(f"cost.train_s_per_token must be > 0 (got {self.train_s_per_token})")
        for name in ("share_decode_slowdown", "share_train_slowdown"):
            if not getattr(self, name) >= 1.0:
                bad.append(f"cost.{name} must be >= 1 (got {getattr(self, name)})")
        if self.train_max_token_len < 0:
            bad.append(f"cost.train_max_token_len must be >= 0 (got {self.train_max_token_len})")
        for name in ("train_dp_devices", "micro_batch_size"):
            if getattr(self, name) < 1:
                bad.append(f"cost.{name} must be >= 1 (got {getattr(self, name)})")
        return bad


def decode_seconds(cost: SimCost, k: int, n: int, kv: float) -> float:
    """Seconds for `k` decode steps of `n` running sequences starting with `kv` cached tokens."""
    return k * (cost.decode_a + cost.decode_b * n + cost.decode_c * kv) + cost.decode_c * n * k * (k - 1) / 2


def steps_to_reach(cost: SimCost, dt: float, n: int, kv: float) -> int:
    """Smallest k >= 0 with decode_seconds(k) >= dt: the first step boundary at or after `dt`."""
    if dt <= 0:
        return 0
    alpha = cost.decode_a + cost.decode_b * n + cost.decode_c * kv
    beta = cost.decode_c * n / 2
    if beta <= 0:
        k = math.ceil(dt / alpha - 1e-12)
    else:
        lin = alpha - beta
        k = math.ceil((-lin + math.sqrt(lin * lin + 4 * beta * dt)) / (2 * beta) - 1e-12)
    k = max(k, 1)
    while decode_seconds(cost, k, n, kv) < dt:  # float guard
        k += 1
    return k


def _lpt_loads(tokens: np.ndarray, ranks: int) -> np.ndarray:
    """Largest-first greedy partition (the Karmarkar-Karp family verl uses); returns per-rank loads."""
    loads = np.zeros(ranks)
    for x in np.sort(tokens)[::-1]:
        loads[int(np.argmin(loads))] += x
    return loads


def _sorted_padded_loads(tokens: np.ndarray, ranks: int, micro_batch: int, budget: int) -> np.ndarray:
    """Token slots per rank of asp-npu's unpacked trainer (`trainer/batching.py`): samples dealt longest
    first to the rank with the fewest real tokens, each rank's samples (longest first) cut into
    micro-batches of `micro_batch` samples, or of as many as fit `budget` padded tokens, each row padded to
    its micro-batch's longest sample."""
    per: list[list[float]] = [[] for _ in range(ranks)]
    real = np.zeros(ranks)
    for x in np.sort(tokens)[::-1]:
        r = int(np.argmin(real))
        real[r] += x
        per[r].append(float(x))
    loads = np.zeros(ranks)
    for r, xs in enumerate(per):
        i = 0
        while i < len(xs):
            j = i + 1
            while j < len(xs) and ((j + 1 - i) * xs[i] <= budget if budget else j - i < micro_batch):
                j += 1
            loads[r] += xs[i] * (j - i)
            i = j
    return loads


def train_seconds(cost: SimCost, seq_tokens: np.ndarray, devices: int, padded: bool) -> tuple[float, float]:
    """(seconds, useful fraction) of one trainer pass over sequences of `seq_tokens` on `devices`.

    The rank with the most (padded) tokens sets the time; the useful fraction is real tokens over
    ranks x that maximum (the rest is padding / imbalance, counted as padding bubble).
    """
    tokens = np.asarray(seq_tokens, dtype=np.float64)
    if tokens.size == 0:
        return 0.0, 1.0
    ranks = max(1, devices // cost.train_dp_devices)
    if padded:
        per_rank = np.array_split(tokens, ranks)
        loads = np.zeros(ranks)
        for r, chunk in enumerate(per_rank):
            mb = cost.micro_batch_size
            for lo in range(0, chunk.size, mb):
                part = chunk[lo : lo + mb]
                loads[r] += part.max() * part.size if part.size else 0.0
    elif cost.train_packed:
        loads = _lpt_loads(tokens, ranks) if ranks > 1 else np.array([tokens.sum()])
    else:
        loads = _sorted_padded_loads(tokens, ranks, cost.micro_batch_size, cost.train_max_token_len)
    peak = float(loads.max())
    rank_devices = min(devices, cost.train_dp_devices)
    seconds = cost.train_step_s + peak * cost.train_s_per_token / rank_devices
    # devices beyond whole ranks sit idle: they count against the useful share too
    useful = float(tokens.sum()) / (ranks * peak) * (ranks * rank_devices / devices) if peak > 0 else 1.0
    return seconds, min(1.0, useful)
