"""A lower bound on a run's mean iteration time for the same devices and work (docs/simulator.md).

Every term is a time no schedule on these devices can beat, under the preset's own cost model:

- **work**: training needs `W_t = train_s_per_token x (prompt + response tokens)` device-seconds
  (balanced ranks, no padding); rollout at least `W_r = d x sum over samples of
  [r (a/S + b) + c (r p + r (r-1)/2) + prefill_s_per_token x p]` device-seconds (every step at full
  batch `S`, each token paying only its own context; `d` = devices per instance). A colocated mode
  does both on all `D` devices in turn: `T >= (W_t + W_r) / D`. A disaggregated mode splits the
  devices into `k` instances and a trainer: `T >= min over splits of max(W_t / trainer devices in
  whole ranks, W_r / (k d))`, over the same candidate splits every disaggregated mode may take.
- **the longest sample**: a sample decodes one token per step, and no step is faster than batch 1
  (`a + b + c x context`): `T >= prefill + decode at batch 1` of the longest sample. With a rollout
  barrier (iteration `i + 1` starts generating when iteration `i` is generated: synchronous modes,
  one-step-off) the iterations' longest samples add up.

`lag_floor_s` (a diagnostic, not part of either bound): under a policy-lag bound a group must be
consumed within `max_lag + 1` weights versions of the version it was admitted with, so a sample that
takes `L` seconds even at batch 1 forces `max_lag + 1` consecutive versions to span at least `L`
(partial rollout: its oldest token within `max_token_lag + 1` versions). With a length-capped sample
in every iteration and admission in data order, the versions then average at least `L / (lag + 1)`.
It says when a lag-bounded pipeline cannot reach `hardware_s` whatever its split or schedule.

`hardware_s` drops what is the mode's own structure (the split, the barrier): `max((W_t + W_r) / D,
the longest sample)`, the same for every mode -- how far a mode is from what the devices allow.
Multi-turn trajectories: the rollout work adds the prefill of every tool output and each turn's
tokens read their whole context (prompt, earlier turns, tool outputs); the training work counts the
tool outputs as sequence tokens; a trajectory alone takes its decode at batch 1 plus its tool
latencies (a tool wait holds no slot, so it costs no device time, only the trajectory's own latency).

The bound is over the whole run; the mean iteration time's bound is it divided by the iterations
(the simulator's mean iteration time is the wall time over the iterations, the first included).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asp_npu.sim.modes import candidate_splits, pipeline_factor
from asp_npu.sim.preset import Preset
from asp_npu.sim.workload import Workload


@dataclass(frozen=True)
class Limit:
    """The run's lower bound (seconds) and its terms."""

    train_device_s: float
    rollout_device_s: float
    work_s: float  # the devices' bound from W_t and W_r (colocated: sum; disaggregated: best split)
    longest_s: float  # the longest sample(s) at batch 1 (summed per iteration under a barrier)
    iterations: int
    hardware_s: float = 0.0  # any mode on these devices: max((W_t + W_r) / D, the longest sample)
    lag_floor_s: float = 0.0  # diagnostic: the longest sample spread over the lag bound's versions (0: none)

    @property
    def run_s(self) -> float:
        return max(self.work_s, self.longest_s)

    @property
    def iteration_s(self) -> float:
        return self.run_s / max(1, self.iterations)

    @property
    def hardware_iteration_s(self) -> float:
        return self.hardware_s / max(1, self.iterations)

    @property
    def lag_floor_iteration_s(self) -> float:
        return self.lag_floor_s / max(1, self.iterations)

    def as_dict(self) -> dict[str, float]:
        return {
            "iteration_s": self.iteration_s,
            "hardware_iteration_s": self.hardware_iteration_s,
            "lag_floor_iteration_s": self.lag_floor_iteration_s,
            "work_s": self.work_s,
            "longest_sample_s": self.longest_s,
            "train_device_s": self.train_device_s,
            "rollout_device_s": self.rollout_device_s,
        }


def _per_sample(preset: Preset, workload: Workload) -> tuple[np.ndarray, np.ndarray]:
    """(minimum rollout device-seconds, batch-1 seconds) of every sample, shape (G, n)."""
    c, cl = preset.cost, preset.cluster
    r = workload.response_len.astype(np.float64)
    p = np.broadcast_to(workload.prompt_len.astype(np.float64)[:, None], r.shape)
    if workload.turns is None:
        kv = c.decode_c * (r * p + r * (r - 1) / 2)  # each token reads its own context once
        prefill = c.prefill_s_per_token * p
        wait: np.ndarray | float = 0.0
    else:
        kv = c.decode_c * _turn_kv_steps(workload, p.ravel()).reshape(r.shape)
        prefill = c.prefill_s_per_token * (p + workload.tool_len)
        wait = workload.tool_seconds
    full = r * (c.decode_a / cl.max_num_seqs + c.decode_b) + kv + prefill
    alone = r * (c.decode_a + c.decode_b) + kv + prefill + wait
    return cl.infer_tp * full, alone


def _turn_kv_steps(workload: Workload, prompt: np.ndarray) -> np.ndarray:
    """Per sample, the sum over its decoded tokens of the context each reads: turn k's `r_k` tokens
    start from `prompt + earlier turns' tokens + earlier tool outputs`."""
    tr = workload.turns
    assert tr is not None
    n = tr.counts
    row = np.repeat(np.arange(n.size), n)
    start = np.repeat(tr.offsets[:-1], n)
    cm = np.cumsum(tr.model) - tr.model  # exclusive cumsums, then made per row
    ct = np.cumsum(tr.tool_tokens) - tr.tool_tokens
    before_m = cm - cm[start]
    before_t = ct - ct[start]
    rk = tr.model.astype(np.float64)
    ctx = prompt[row] + before_m + before_t
    steps: np.ndarray = np.bincount(row, weights=rk * ctx + rk * (rk - 1) / 2, minlength=n.size)
    return steps


def limit(preset: Preset, workload: Workload, colocated: bool, barrier: bool,
          lag: int | None = None, version_groups: int = 0) -> Limit:
    """The bound of one mode (colocated or not, with or without a rollout barrier) on the preset's devices.

    `lag` (versions a group may wait, partial rollout: its token-lag bound) and `version_groups` (groups per
    weights version) give the diagnostic `lag_floor_s`; without them it is 0."""
    c, cl = preset.cost, preset.cluster
    seq_tokens = float(workload.response_len.sum() + workload.prompt_len.sum() * workload.group_size)
    if workload.turns is not None:
        seq_tokens += float(workload.tool_len.sum())
    w_t = c.train_s_per_token * seq_tokens
    roll, alone = _per_sample(preset, workload)
    w_r = float(roll.sum())
    if colocated:
        work = (w_t + w_r) / cl.devices
    else:
        best = float("inf")
        for lay in candidate_splits(preset):
            t = lay.trainer_devices
            if lay.trainer_tp:  # a legal shape: whole, slowed by its pipeline
                dp = t // (lay.trainer_tp * lay.trainer_pp)
                usable = t / pipeline_factor(preset, lay.trainer_tp, lay.trainer_pp, dp)
            else:
                usable = t - t % c.train_dp_devices if t >= c.train_dp_devices else t
            best = min(best, max(w_t / usable, w_r / (lay.instances * lay.instance_devices)))
        work = best
    longest_per_group = alone.max(axis=1)
    if barrier:
        per_iter = np.zeros(workload.num_iterations)
        np.maximum.at(per_iter, workload.iteration, longest_per_group)
        longest = float(per_iter.sum())
    else:
        longest = float(longest_per_group.max())
    hardware = max((w_t + w_r) / cl.devices, float(longest_per_group.max()))
    lag_floor = 0.0
    if lag is not None and version_groups > 0 and not barrier:
        versions = workload.num_groups / version_groups
        lag_floor = float(longest_per_group.max()) * versions / (lag + 1)
    return Limit(w_t, w_r, work, longest, workload.num_iterations, hardware, lag_floor)
