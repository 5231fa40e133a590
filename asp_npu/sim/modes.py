"""The six modes (ARCHITECTURE.md section 7) as data, the device-split rule, and each mode's work source.

- `mindspeed-sync`: colocated on all devices; each DP instance gets a contiguous share of the batch;
  lag 0 (refresh per iteration, paying resharding + offload/onload both ways); trainer with fixed
  micro-batches padded to their longest sequence, samples dealt to DP ranks in order.
- `verl-sync`: colocated; requests spread evenly over the servers (round robin); lag 0 with the same
  switch costs; trainer with `balance_batch` (Karmarkar-Karp) + dynamic batch size.
- `one-step-off`: split rule; round robin batch by batch (the next batch starts when the previous
  one is generated); lag 1 iteration, one refresh per iteration; balanced trainer.
- `async-fifo`: split rule; one global FIFO pulled group by group whenever a slot frees; the
  preset's `max_lag`; balanced trainer. ASP's architecture without its plan.
- `sortedrl`: colocated on all devices, oversubscribed FIFO rollout; as soon as the shortest finished
  groups form an update group the rollout is preempted, the trainer updates (shortest first) and the
  unfinished sequences resume (partial rollout, re-prefilled) with the new weights; the off-policy
  cache bound is the same staleness budget in samples as the other asynchronous modes.
- `asp`: split rule; the real predictor, the preset's `max_lag`; balanced trainer. Stream executor:
  groups offered one admission window (iteration) at a time and dispatched by
  `asp_npu.schedule.dispatch.StreamDispatcher` (predicted-long groups spread by in-flight KV load);
  unit executor: per-window plan from the real planner, run in plan order, undispatched units
  re-bound to idle instances.

Every mode gets the same devices and the same prompts. Disaggregated modes all use one split rule
(`split_devices`): the instance count that balances predicted rollout and training throughput.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from asp_npu.core.modes import BASELINES, MODES, TABLE, Mode, sim_mode
from asp_npu.core.records import Unit
from asp_npu.core.staleness import TOKEN_LAG_FACTOR
from asp_npu.errors import UserError
from asp_npu.sim.cost import SimCost
from asp_npu.sim.engine import RunSpec, UnitSource
from asp_npu.sim.preset import Preset, parse_shapes
from asp_npu.sim.workload import Workload

# partial rollout's default bound on the oldest token: 4 x max_lag (`asp_npu.core.staleness`, shared
# with the real pipeline). At the `paper` point with the FLOP-derived trainer cost a 16k-token straggler
# spans ~3 iterations, so 2 x max_lag binds at max_lag 1-2 and halves the gain (docs/simulator.md); the
# oldest tokens' lag there stays within 4 x.
SPECS: dict[str, Mode] = TABLE  # the one mode table (asp_npu.core.modes); kept under the simulator's old name
__all__ = [
    "BASELINES", "MODES", "SPECS", "DeviceSplit", "layout_for", "partial_allowed", "run_spec", "split_devices"
]


@dataclass(frozen=True)
class DeviceSplit:
    devices: int
    instances: int
    instance_devices: int
    trainer_devices: int
    trainer_tp: int = 0  # with `cluster.trainer_shapes`: the trainer's TP x PP shape (0: DP ranks of
    trainer_pp: int = 1  # `cost.train_dp_devices` devices, the model without shapes)

    def describe(self) -> str:
        t = f"{self.trainer_devices}T"
        if self.trainer_tp:
            dp = self.trainer_devices // (self.trainer_tp * self.trainer_pp)
            t += f" (TP{self.trainer_tp} x PP{self.trainer_pp} x DP{dp})"
        return f"{self.instances} x {self.instance_devices} + {t}"


def micro_batches_per_step(preset: Preset) -> int:
    """Micro-batches of one asynchronous trainer step over all DP ranks (minibatch / micro_batch_size)."""
    return max(1, preset.rl.mini_batch_size // max(1, preset.cost.micro_batch_size))


def pipeline_factor(preset: Preset, tp: int, pp: int, dp: int) -> float:
    """How much longer a TP x PP x DP trainer takes than its devices' ideal: the pipeline's slowest stage
    (the most layers a stage holds over the mean) times the 1F1B bubble `(m + pp - 1) / m` over the
    `m` micro-batches each DP rank runs per step."""
    if pp <= 1:
        return 1.0
    layers = preset.cluster.trainer_layers
    imbalance = math.ceil(layers / pp) / (layers / pp)
    m = max(1, micro_batches_per_step(preset) // dp)
    return imbalance * (m + pp - 1) / m


def trainer_shape(preset: Preset, t_dev: int) -> tuple[int, int, float] | None:
    """The best legal (TP, PP, factor) for `t_dev` trainer devices under `cluster.trainer_shapes`:
    DP copies of one shape, DP dividing the step's micro-batches; None when no shape fits."""
    best: tuple[int, int, float] | None = None
    mbs = micro_batches_per_step(preset)
    for tp, pp in parse_shapes(preset.cluster.trainer_shapes):
        size = tp * pp
        if t_dev % size or mbs % (t_dev // size):
            continue
        f = pipeline_factor(preset, tp, pp, t_dev // size)
        if best is None or f < best[2] - 1e-12:
            best = (tp, pp, f)
    return best


def trainer_cost(preset: Preset, cost: SimCost, lay: DeviceSplit) -> SimCost:
    """The cost a layout's trainer runs at: one DP rank = its TP x PP devices, slowed by its pipeline."""
    if not lay.trainer_tp:
        return cost
    dp = lay.trainer_devices // (lay.trainer_tp * lay.trainer_pp)
    f = pipeline_factor(preset, lay.trainer_tp, lay.trainer_pp, dp)
    return replace(cost, train_dp_devices=lay.trainer_tp * lay.trainer_pp,
                   train_s_per_token=cost.train_s_per_token * f)


def predicted_stage_seconds(
    preset: Preset, workload: Workload, instances: int, trainer_devices: int
) -> tuple[float, float]:
    """(rollout seconds, training seconds) per iteration from mean lengths, ignoring tails.

    Rollout: the iteration's samples spread over the instances, each decoding at the batch size it
    then holds (capped by `max_num_seqs`); training: all sequence tokens at `train_s_per_token`.
    """
    c: SimCost = preset.cost
    per_iter = workload.prompts_per_iteration * workload.group_size
    mean_resp = float(workload.response_len.mean())
    mean_prompt = float(workload.prompt_len.mean())
    batch = max(1.0, min(preset.cluster.max_num_seqs, per_iter / instances))
    step = c.decode_a + c.decode_b * batch + c.decode_c * batch * (mean_prompt + mean_resp / 2)
    rollout = per_iter * mean_resp / (instances * batch / step)
    steps = per_iter / max(1, preset.rl.mini_batch_size)
    tokens = per_iter * (mean_prompt + mean_resp)
    train = steps * c.train_step_s + tokens * c.train_s_per_token / trainer_devices
    return rollout, train


def candidate_splits(preset: Preset, devices: int | None = None) -> list[DeviceSplit]:
    """Every split with at least `min_trainer_devices` trainer devices in whole trainer ranks (TP x PP)."""
    cl = preset.cluster
    devices = devices or cl.devices
    dp = preset.cost.train_dp_devices
    out = []
    if cl.trainer_shapes is not None:  # only the trainer's legal shapes
        for k in range(1, (devices - cl.min_trainer_devices) // cl.infer_tp + 1):
            t_dev = devices - k * cl.infer_tp
            shape = trainer_shape(preset, t_dev)
            if shape is not None:
                out.append(DeviceSplit(devices, k, cl.infer_tp, t_dev, shape[0], shape[1]))
        if out:
            return out
    for k in range(1, (devices - cl.min_trainer_devices) // cl.infer_tp + 1):
        t_dev = devices - k * cl.infer_tp
        if t_dev % dp == 0 or t_dev < dp:
            out.append(DeviceSplit(devices, k, cl.infer_tp, t_dev))
    if not out:  # no split fits whole ranks: allow partial ranks rather than fail
        out = [
            DeviceSplit(devices, k, cl.infer_tp, devices - k * cl.infer_tp)
            for k in range(1, (devices - cl.min_trainer_devices) // cl.infer_tp + 1)
        ]
    return out


def split_devices(preset: Preset, workload: Workload, devices: int | None = None) -> DeviceSplit:
    """The one split rule of every disaggregated mode: minimise max(rollout, training) predicted time."""
    best: tuple[float, DeviceSplit] | None = None
    for lay in candidate_splits(preset, devices):
        r, tr = predicted_stage_seconds(preset, workload, lay.instances, lay.trainer_devices)
        score = max(r, tr)
        if best is None or score < best[0] - 1e-12:
            best = (score, lay)
    assert best is not None  # validate() guarantees one instance + the minimum trainer fit
    return best[1]


def colocated_layout(preset: Preset, devices: int | None = None) -> DeviceSplit:
    devices = devices or preset.cluster.devices
    return DeviceSplit(devices, max(1, devices // preset.cluster.infer_tp), preset.cluster.infer_tp, devices)


def layout_for(mode: str, preset: Preset, workload: Workload, instances: int | None = None) -> DeviceSplit:
    """The device split of `mode`; with `instances` (scaling sweep) disaggregated modes get exactly that many
    instances plus the fixed sweep trainer, and colocated modes get the same number of devices."""
    cl = preset.cluster
    if instances is None:
        return colocated_layout(preset) if SPECS[mode].colocated_in_sim else split_devices(preset, workload)
    devices = instances * cl.infer_tp + cl.sweep_trainer_devices
    if SPECS[mode].colocated_in_sim:
        return colocated_layout(preset, devices)
    return DeviceSplit(devices, instances, cl.infer_tp, cl.sweep_trainer_devices)


def partial_allowed(mode: str) -> bool:
    """`Mode.allows_partial` as the simulator models the mode."""
    return SPECS[mode].allows_partial(simulated=True)


def run_spec(mode: str, preset: Preset, workload: Workload, layout: DeviceSplit) -> RunSpec:
    """The simulator's run of `mode` (its row in the one mode table, under the preset's executor)."""
    ms = sim_mode(mode, preset.rl.executor)
    per_iter = workload.prompts_per_iteration
    if ms.refresh_per_window:  # synchronous / one-step-off: the whole batch is one minibatch and version
        mb = version = per_iter
        lag = ms.fixed_lag if ms.fixed_lag is not None else preset.rl.max_lag
    else:
        mb = preset.rl.mini_batch_size // workload.group_size
        k = preset.rl.sync_every_minibatches
        if ms.partial_rollout:  # colocated: the rollout uses new weights after every update group
            version, lag = mb, (preset.rl.max_lag + 1) * k - 1  # the same staleness budget in samples
        else:
            version, lag = mb * k, preset.rl.max_lag
    dealt = bool(ms.deal)
    partial = preset.rl.partial_rollout
    if partial and not ms.allows_partial(lag, simulated=True):
        raise UserError(
            f"rl.partial_rollout: mode '{mode}' is synchronous or colocated; partial rollout needs "
            "an asynchronous disaggregated mode"
        )
    token_lag = preset.rl.max_token_lag if preset.rl.max_token_lag is not None else TOKEN_LAG_FACTOR * lag
    if partial and token_lag < lag:
        raise UserError(f"rl.max_token_lag ({token_lag}) must be >= mode '{mode}''s max_lag ({lag})")
    return RunSpec(
        mode=mode,
        colocated=ms.colocated_in_sim,
        instances=layout.instances,
        slots=preset.cluster.max_num_seqs,
        instance_devices=layout.instance_devices,
        trainer_devices=layout.trainer_devices,
        minibatch_groups=mb,
        version_groups=version,
        max_lag=lag,
        dispatch="static" if dealt else ms.dispatch,
        steal=ms.steal,
        unit_exec=ms.admission == "unit" and not dealt and not ms.colocated_in_sim,
        barrier=ms.refresh_per_window,
        trainer_padded=ms.trainer_padded,
        order=ms.queue_order,
        preempt=ms.partial_rollout,
        devices=layout.devices,
        partial_rollout=partial,
        max_token_lag=token_lag if partial else None,
    )


def static_source(workload: Workload, instances: int, how: str) -> UnitSource:
    """Per-instance work of one iteration: `chunk` = contiguous shares, `round_robin` = dealt in turn."""

    def units_for(it: int) -> list[Unit[int]]:
        g = workload.iteration_groups(it)
        if how == "chunk":
            parts = np.array_split(g, instances)
        else:
            parts = [g[k::instances] for k in range(instances)]
        return [Unit(k, it, tuple(p.tolist()), workload.group_size, k) for k, p in enumerate(parts) if len(p)]

    return units_for


def pull_source(workload: Workload) -> UnitSource:
    """One global FIFO of single groups in data-loader order."""

    def units_for(it: int) -> list[Unit[int]]:
        groups = workload.iteration_groups(it).tolist()
        return [Unit(j, it, (g,), workload.group_size) for j, g in enumerate(groups)]

    return units_for
