"""The simulator's estimate of iteration time and throughput for a checked layout, for ASP and for
`mindspeed-sync` on the same NPUs (what `asp-npu check` prints).

It builds a simulator preset from the config and the layout and calls `asp_npu.sim` (same planner,
queue and cost model as `asp-npu bench sim`). Cost numbers start from the `paper` preset (Qwen2.5-7B
on Ascend 910B, every number sourced in docs/simulator.md) and are rescaled to this model and
inference TP with the formulas the preset's sources state: weight reads, KV reads, prefill FLOPs
and trainer FLOPs per token scale with the model. Response lengths follow the same synthetic
reasoning-trace shape, scaled to the config's `max_tokens`. An estimate to compare layouts and
modes before queueing, not a measurement: calibrate on the cluster (`asp-npu calibrate`) for that.

What the trainer's layout costs on top of its tokens (what the layout search trades against memory):
- full recompute: one more forward of the update, 2N of the preset's 10N FLOP per token (x1.2);
- pipeline parallelism: 1F1B's bubble, (PP - 1) / m more time for m micro-batches per rank and step;
- optimizer state on the host: each step the host updates the rank's offloaded shard (Adam, seconds per
  offloaded parameter: `trainer.host_optimizer_s_per_param` as `asp-npu calibrate` measured it, else
  the documented NPU-host HOST_ADAM_S_PER_PARAM) and the shard's gradients / parameters cross PCIe
  (PCIE_S_PER_PARAM), charged as trainer step time (`host_optimizer_s_per_param`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from typing import Any

from asp_npu.config import Config
from asp_npu.deploy.layout import Deployment

HBM_BYTES_PER_S = 1.6e12  # Ascend 910B HBM bandwidth per NPU (an A3 die is taken as the same)
ITERATIONS = 8
ASP_LAG_FOR_SYNC_CONFIGS = 2  # a synchronous (lag 0) config: ASP is estimated at the shipped configs' lag
# Host-side Adam per offloaded parameter of a rank on an NPU host, a documented figure used where no
# calibration gives the machine's own (`trainer.host_optimizer_s_per_param`, from `asp-npu calibrate`):
# torch's fused AdamW is memory-bound at ~28 bytes/param (read param, grad, 2 moments; write param,
# 2 moments) over ~14 GB/s per rank (a Kunpeng 920 node's ~230 GB/s DDR shared by its 16 trainer ranks).
HOST_ADAM_S_PER_PARAM = 2.0e-9
# the fp32 gradient down and the bf16 parameter up over PCIe 4.0 x16 (~25 GB/s): 6 B per parameter; not in
# what `calibrate` measures (its probe runs on the host alone), so charged on top of either Adam figure
PCIE_S_PER_PARAM = 0.24e-9
HOST_OPTIMIZER_S_PER_PARAM = HOST_ADAM_S_PER_PARAM + PCIE_S_PER_PARAM  # 2.24e-9: the uncalibrated charge
FULL_RECOMPUTE_FACTOR = 1.2  # update 6N + old-logprob 2N + ref 2N, plus a second 2N forward of the update
# PPO's critic on the trainer's devices: its scoring forward 2N and update 6N per token after the policy's
# update 6N + old-logprob 2N + ref 2N
CRITIC_FACTOR = 1.8


def trainer_layout_costs(cfg: Config, lay: Deployment) -> tuple[float, float]:
    """(factor on trainer seconds per token, extra seconds per optimizer step) of the trainer's layout."""
    from asp_npu.deploy.memory import offloaded_params, seq_len, tokens_per_micro_batch

    act, rl = cfg.actor_config, cfg.rl_config
    per_rank = max(1, rl.mini_batch_size // max(1, act.data_parallel_size))
    micro = max(1, per_rank * seq_len(cfg) // tokens_per_micro_batch(cfg)) if act.use_dynamic_bsz else max(
        1, per_rank // act.micro_batch_size)
    factor = (1 + (act.pipeline_model_parallel_size - 1) / micro) * (
        FULL_RECOMPUTE_FACTOR if act.recompute_granularity == "full" else 1.0)
    if rl.adv_estimator == "gae":
        factor *= CRITIC_FACTOR
    host_step = 0.0 if lay.arch is None else offloaded_params(cfg, lay.arch) * host_optimizer_s_per_param(cfg)
    return factor, host_step


def host_optimizer_s_per_param(cfg: Config) -> float:
    """Seconds per offloaded parameter of a rank's optimizer step on the host: the calibrated (else the
    documented) Adam figure plus the PCIe round trip."""
    return (cfg.trainer.host_optimizer_s_per_param or HOST_ADAM_S_PER_PARAM) + PCIE_S_PER_PARAM


def calibrated_host_optimizer(path: str) -> float:
    """`host_optimizer_s_per_param` of an `asp-calib/1` file (`check --calib`); one line if it has none."""
    from pathlib import Path

    from asp_npu.errors import InvalidValue, UserError
    from asp_npu.sim.preset import read_calibration
    from asp_npu.validation import check_float

    d = read_calibration(Path(path))
    v = d.get("host_optimizer_s_per_param")
    if v is None:
        raise UserError(f"{path}: no host_optimizer_s_per_param (written by an older `asp-npu calibrate`: "
                        "run it again)")
    try:
        return check_float(f"{path}: host_optimizer_s_per_param", v, 0.0, 1e-3, lo_open=True)
    except InvalidValue as exc:
        raise UserError(str(exc)) from None


@functools.lru_cache(maxsize=1)
def _paper() -> Any:
    """The `paper` preset, read once (the layout search builds a preset per candidate)."""
    from asp_npu.sim.preset import load_preset

    return load_preset("paper")


def build_preset(cfg: Config, lay: Deployment) -> Any:
    """A `asp_npu.sim.preset.Preset` for this config on this layout."""
    from asp_npu.sim.preset import Preset

    base = _paper()
    a = lay.arch
    assert a is not None
    itp, iep = cfg.generate_config.infer_tensor_parallel_size, cfg.generate_config.infer_expert_parallel_size
    cost = _scaled_cost(cfg, lay, base)
    return Preset(
        f"check:{lay.mode}",
        _cluster(cfg, lay, cost.train_dp_devices),
        _workload(cfg, base),
        _rl_spec(cfg, lay),
        cost,
        dict(base.sources),
        [
            f"cost from the 'paper' preset scaled to {a.params / 1e9:.1f}B params"
            + (f" ({a.active_params / 1e9:.1f}B active)" if a.moe else "")
            + f", inference TP{itp}"
            + (f" x EP{iep}" if iep > 1 else "")
        ],
        base.path,
    )


def _scaled_cost(cfg: Config, lay: Deployment, base: Any) -> Any:
    """The paper preset's cost model rescaled to this model, inference TP / EP and trainer layout, so the
    estimate inherits its sourced numbers instead of new guesses."""
    a = lay.arch
    assert a is not None
    gen, act = cfg.generate_config, cfg.actor_config
    itp, base_itp = gen.infer_tensor_parallel_size, base.cluster.infer_tp
    wb = 4 if cfg.model.dtype == "float32" else 2
    ref_params = 7.6e9  # the paper preset's model (Qwen2.5-7B)
    scale = a.active_params / ref_params  # compute per token follows the active (MoE: top-k) weights
    iep = gen.infer_expert_parallel_size
    # a decode step reads each NPU's weights: dense / TP, routed experts / EP (/ TP without EP)
    weights_read = (a.dense_params / itp + a.expert_params / (iep if iep > 1 else itp)) * wb / HBM_BYTES_PER_S
    base_weights_read = ref_params * 2 / base_itp / HBM_BYTES_PER_S
    c = base.cost
    layout_factor, host_step = trainer_layout_costs(cfg, lay)
    return replace(
        c,
        decode_a=c.decode_a - base_weights_read + weights_read,
        decode_c=a.kv_bytes_per_token(wb, 1) / itp / HBM_BYTES_PER_S,
        prefill_s_per_token=c.prefill_s_per_token * scale * base_itp / itp,
        train_s_per_token=c.train_s_per_token * scale * layout_factor,
        train_step_s=c.train_step_s + host_step,
        train_dp_devices=act.tensor_model_parallel_size * act.pipeline_model_parallel_size
        * act.context_parallel_size,
        micro_batch_size=act.micro_batch_size,
        train_packed=act.use_remove_padding,  # unpacked, our trainer pads its length-sorted micro-batches
        train_max_token_len=act.ppo_max_token_len_per_gpu if act.use_dynamic_bsz else 0,
        refresh_s=c.refresh_s * scale,
        to_train_s=c.to_train_s * scale,
        to_infer_s=c.to_infer_s * scale,
    )


def _cluster(cfg: Config, lay: Deployment, rank_devices: int) -> Any:
    """The simulated cluster: colocated NPUs count once, and ASP may pick its own split there."""
    from asp_npu.sim.preset import Cluster

    devices = lay.rollout_npus + lay.trainer_npus
    if lay.colocated:
        devices = max(lay.rollout_npus, lay.trainer_npus)
    return Cluster(
        devices=devices,
        infer_tp=cfg.generate_config.infer_tensor_parallel_size,
        max_num_seqs=cfg.generate_config.max_num_seqs,
        # a colocated config gives ASP the best simulated split (>= one trainer DP rank); else the layout's
        min_trainer_devices=rank_devices if lay.colocated else lay.trainer_npus,
        sweep_trainer_devices=lay.trainer_npus,
        split="search" if lay.colocated else "rule",
    )


def _workload(cfg: Config, base: Any) -> Any:
    """The paper preset's synthetic trace shape, scaled to this config's batch, max_tokens and prompts."""
    from asp_npu.sim.preset import WorkloadSpec

    rl = cfg.rl_config
    n = rl.n_samples_per_prompt
    ppi = rl.global_batch_size or max(1, rl.mini_batch_size // n)
    synth = dict(base.workload.synth)
    cap = cfg.generate_config.sampling_config.max_tokens
    synth.update(
        n=n,
        prompts=ppi * 2,
        epochs=math.ceil(ITERATIONS / 2) + 1,
        max_len=cap,
        median_len=max(16.0, float(synth.get("median_len", 2048)) * cap / float(synth.get("max_len", 16384))),
        prompt_median=min(float(synth.get("prompt_median", 160)), rl.max_prompt_length / 2),
    )
    return WorkloadSpec(
        prompts_per_iteration=ppi, n_samples_per_prompt=n, iterations=ITERATIONS, synth=synth
    )


def _rl_spec(cfg: Config, lay: Deployment) -> Any:
    """The RL schedule to simulate; a synchronous colocated config gets ASP's usual lag for comparison."""
    from asp_npu.sim.preset import RLSpec

    rl = cfg.rl_config
    return RLSpec(
        mini_batch_size=rl.mini_batch_size,
        max_lag=max(rl.max_lag, ASP_LAG_FOR_SYNC_CONFIGS) if lay.colocated else rl.max_lag,
        sync_every_minibatches=rl.weight_refresh_interval,
        predictor=rl.predictor if rl.predictor in ("history", "prompt-len", "oracle") else "history",
        executor="stream",
        plan_window=1,
    )


def estimate(cfg: Config, lay: Deployment) -> tuple[list[dict[str, Any]] | None, str]:
    """Rows {mode, layout, iteration_s, throughput_tok_s} for asp and mindspeed-sync, and a note.

    Returns (None, reason) when the simulator cannot run this layout."""
    try:
        from asp_npu.sim.modes import DeviceSplit
        from asp_npu.sim.preset import validate
        from asp_npu.sim.run import build_workload, simulate, simulate_layout
    except ImportError as exc:
        return None, f"simulator not available ({exc})"
    if lay.arch is None or not lay.instances or not lay.trainer:
        return None, "no layout to simulate"
    preset = build_preset(cfg, lay)
    problems = validate(preset)
    if problems:
        return None, "simulator cannot model this config: " + "; ".join(problems)
    workload = build_workload(preset)
    rows = []
    for mode in ("asp", "mindspeed-sync"):
        if mode == "asp" and not lay.colocated:
            itp = cfg.generate_config.infer_tensor_parallel_size
            sim_lay = DeviceSplit(preset.cluster.devices, len(lay.instances), itp, lay.trainer_npus)
            run = simulate_layout(preset, workload, mode, sim_lay)
        else:
            run = simulate(preset, workload, mode)
        m, sl = run.metrics, run.layout
        where = (
            f"{sl.instances} x TP{sl.instance_devices} colocated on {sl.devices} NPUs"
            if mode == "mindspeed-sync"
            else f"{sl.instances} x TP{sl.instance_devices} + trainer {sl.trainer_devices} NPUs"
        )
        rows.append(
            {
                "mode": mode,
                "layout": where,
                "iteration_s": m["iteration_time_mean_s"],
                "throughput_tok_s": m["throughput_tokens_per_s"],
                "utilization": m["utilization"],
            }
        )
    note = (
        f"simulator estimate ({ITERATIONS} iterations of {preset.workload.prompts_per_iteration} prompts x "
        f"{preset.workload.n_samples_per_prompt}, synthetic reasoning lengths capped at "
        f"{preset.workload.synth['max_len']} tokens, {preset.notes[0]}"
        + (
            f"; ASP on its best simulated split of the same NPUs at max_lag {preset.rl.max_lag}"
            if lay.colocated
            else ""
        )
        + "; not a measurement):"
    )
    return rows, note
