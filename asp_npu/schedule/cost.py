"""The planner's cost model of continuous-batching decode on one rollout instance.

One decode step with `batch` running sequences holding `kv_tokens` tokens of KV cache takes
`a + b*batch + c*kv_tokens` seconds. A unit runs as one batch: all its samples start together and
the instance takes its next unit when the last one ends (that wait is the padding bubble). Summing
the step time over the unit's steps gives a closed form:

    seconds = a*steps + b*sum(len) + c*sum(prompt_len*len + len^2/2),
    steps   = max(longest, sum(len) / slots)      # slots = max_num_seqs; a lower bound when n > slots

Defaults are the public Ascend decode figure for a large MoE, 53.5 ms + 0.35 ms per sequence
(ANCHORS.md); the CPU measurement in notes/cpu-stack.md has the same form (24M model: a ~ 6 ms,
b ~ 0.33 ms). `c` defaults to 0 (attention cost per KV token is not public for Ascend).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asp_npu.errors import InvalidValue
from asp_npu.validation import check_float


@dataclass(frozen=True)
class CostModel:
    a: float = 0.0535  # seconds per decode step, fixed part
    b: float = 0.00035  # seconds per running sequence per step
    c: float = 0.0  # seconds per KV-cache token per step

    def __post_init__(self) -> None:
        # finite and bounded: a NaN here used to pass `< 0` checks and stall the timeline forever
        for name in ("a", "b", "c"):
            check_float(f"cost model {name} (seconds)", getattr(self, name), 0.0, 1e6)
        if self.a + self.b <= 0:
            raise InvalidValue(f"cost model needs a + b > 0 (got a={self.a}, b={self.b})")

    def step_seconds(self, batch: float, kv_tokens: float = 0.0) -> float:
        return self.a + self.b * batch + self.c * kv_tokens

    def unit_seconds(
        self,
        longest: np.ndarray,
        total_tokens: np.ndarray,
        slots: int,
        kv_token_steps: np.ndarray | float = 0.0,
    ) -> np.ndarray:
        """Seconds to decode units (vectorised): `longest` and `total_tokens` per unit."""
        longest = np.asarray(longest, dtype=np.float64)
        total = np.asarray(total_tokens, dtype=np.float64)
        steps = np.maximum(longest, total / max(1, slots))
        kv = np.asarray(kv_token_steps, dtype=np.float64)
        seconds: np.ndarray = self.a * steps + self.b * total + self.c * kv
        return seconds


def group_kv_token_steps(mean: np.ndarray, prompt_lens: np.ndarray | None, group_size: int) -> np.ndarray:
    """Predicted sum over a group's decode steps of its KV tokens: n * (p*L + L^2/2) at L = mean."""
    p = 0.0 if prompt_lens is None else np.asarray(prompt_lens, dtype=np.float64)
    kv: np.ndarray = group_size * (p * mean + 0.5 * mean * mean)
    return kv
