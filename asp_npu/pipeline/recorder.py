"""The recorder: everything a real run writes about itself, kept apart from the control loop.

Per trainer step a metrics row and one consumption-ledger row per sample (`samples.jsonl`, with every
token's behaviour version as change points and the lag counted from them), and
failures / recoveries as they happen (`run_log.jsonl`): both appended and flushed at once, so a crashed
run keeps everything up to the crash. Also the controller-side intervals the bubble accounting needs
(blocked / paused / lent instances, trainer busy / paused / lent); at the end the event log, the
timeline, the queue series and `summary.json`.
"""

from __future__ import annotations

import json
import time
from typing import IO, Any

import numpy as np

from asp_npu.config import Config
from asp_npu.core import run_dir as rd
from asp_npu.core.records import GroupKey, Minibatch
from asp_npu.core.shape import RunShape
from asp_npu.core.staleness import token_lag_bound
from asp_npu.io import atomic_write, close_synced
from asp_npu.observe import metrics as M
from asp_npu.pipeline.derived import RunDerived
from asp_npu.pipeline.real_events import InstanceRecord, TrainerRecord, build_event_log
from asp_npu.types import Trajectory
from asp_npu.weights.refresh import Refreshed

RUN_LOG = rd.RUN_LOG  # failures, retries, restarts and recoveries, one JSON line each, as they happen


def token_lag_metrics(hist: dict[int, int]) -> dict[str, Any]:
    """One step's token-lag metrics from {lag: tokens}."""
    n = sum(hist.values())
    return {M.TOKEN_LAG_MEAN: sum(k * c for k, c in hist.items()) / n if n else 0.0,
            M.TOKEN_LAG_MAX: float(max(hist, default=0)), M.TOKEN_LAG_HIST: dict(sorted(hist.items()))}


def baseline_metrics(trajs: list[Trajectory]) -> dict[str, Any]:
    """remax: the greedy baseline responses' tokens, once per group (not samples, not in the
    response-length or throughput figures); nothing when no trajectory carries a baseline."""
    per_group = {t.prompt_id: t.baseline_len for t in trajs if t.reward_baseline is not None}
    return {M.BASELINE_TOKENS: float(sum(per_group.values()))} if per_group else {}


class Recorder:
    def __init__(self, cfg: Config, run: rd.RunDir, shape: RunShape, label: str, console: bool,
                 derived: RunDerived) -> None:
        """`derived`: what this start of the run derived, written beside its config (`derived.yaml`)."""
        self.cfg, self.run_dir, self.shape, self.label, self.console = cfg, run, shape, label, console
        self.policy_path = derived.policy_path
        atomic_write(run / rd.DERIVED, derived.to_yaml())
        self.weights: Any = None  # the run's WeightSync: which path the weights travel (start line, summary)
        self.instances = [InstanceRecord() for _ in range(shape.instances)]
        self.trainer = TrainerRecord()
        self.samples_rows: list[dict[str, Any]] = []
        self.refreshes: list[dict[str, Any]] = []
        self.versions: list[tuple[float, int]] = []
        self.iterations: list[float] = []
        self.step_ends: list[float] = []
        self.train_step_s = 0.0  # trainer seconds per step (moving average; the planner overlaps with it)
        self.t_start = self.last_step_end = 0.0
        self.arrived_tokens = 0  # tokens generated since the last step (vLLM throughput)
        self.token_lag_hist: dict[int, int] = {}  # every consumed token by its lag (the whole run)
        self.lent_since: float | None = None
        loggers = cfg.trainer.logger if console else [x for x in cfg.trainer.logger if x != "console"]
        self.run_log: list[dict[str, Any]] = []
        mode = "a" if run.continuing else "w"  # a resumed run continues its own streamed files
        self._samples: IO[str] | None = open(run / rd.SAMPLES, mode, encoding="utf-8")  # noqa: SIM115
        self._log: IO[str] | None = open(run / RUN_LOG, mode, encoding="utf-8")  # noqa: SIM115
        self.metrics = M.MetricsLogger(run.path, loggers, total_steps=shape.total_steps,
                                       max_lag=shape.max_lag, prefix=f"[{label}] " if label else "",
                                       append=run.continuing, project=cfg.trainer.project_name,
                                       experiment=cfg.trainer.experiment_name)

    def start(self, t: float, version: int, weights: Any = None) -> None:
        """The clock starts; `weights` (the run's WeightSync) says which path the weights travel."""
        self.t_start = self.last_step_end = t
        self.versions.append((t, version))
        self.weights = weights
        if self.console and self.weights is not None:
            w = self.weights.describe()
            how = (f"vLLM's weight-transfer engine ({w['backend']})" if "backend" in w
                   else "Ray's object store")
            print(f"asp-npu: {self.label + ': ' if self.label else ''}weight_refresh through {how} "
                  f"(generate_config.weight_transfer={self.cfg.generate_config.weight_transfer})", flush=True)

    def refreshed(self, r: Refreshed) -> None:
        self.instances[r.instance].paused.append((r.t_end - r.load_s, r.t_end))
        if r.report.get("t_wall_end"):  # on the instance's own clock, as its sequence events
            t = float(r.report["t_wall_end"])
            self.instances[r.instance].frozen.append((t - float(r.report.get("frozen_s", 0.0)), t))
        self.refreshes.append({**r.report, "t_end": r.t_end})

    def generated(self, t_gen: float, t_pause: float, t_train: float) -> None:
        """Colocated: the devices generated from t_gen (the trainer lent them out), the engines paused
        at t_pause and the trainer holds the devices from t_train."""
        self.trainer.lent.append((t_gen, t_train))
        for rec in self.instances:
            rec.paused.append((t_pause, t_train))
        self.lent_since = t_train

    def end_lent(self, t: float) -> None:
        """Colocated: the devices go back from the trainer to the engines (or the run ends)."""
        if self.lent_since is not None:
            for rec in self.instances:
                rec.lent.append((self.lent_since, t))
            self.lent_since = None

    def step(self, mb: Minibatch, out: dict[str, float], t0: float, t1: float, waited_s: float, step: int,
             base: int) -> dict[str, Any]:
        """Record trainer step `step` (counted from 0; `base` = the step a resumed run continued after)."""
        k = self.shape.steps_per_version
        trajs: list[Trajectory] = mb.trajectories
        self.trainer.busy.append((t0, t1))
        self.train_step_s = (t1 - t0) if not self.train_step_s else 0.7 * self.train_step_s + 0.3 * (t1 - t0)
        offset = base // k  # ledger numbers -> run-wide numbers after a resume

        def ledger(weights_step: int) -> int:
            return (weights_step - base) // k + offset

        ledger_step = mb.step + offset
        lags = [ledger_step - ledger(t.policy_version) for t in trajs]
        newest: dict[str, int] = {}  # group -> its newest token's version (partial rollout counts from it)
        hist: dict[int, int] = {}
        first = len(self.samples_rows)
        for t in trajs:
            key = GroupKey.parse(t.prompt_id)
            changes = [[i, ledger(w)] for i, w in t.changes()]
            newest[t.prompt_id] = max(newest.get(t.prompt_id, 0), changes[-1][1])
            for w, n in t.version_segments():
                hist[ledger_step - ledger(w)] = hist.get(ledger_step - ledger(w), 0) + n
            self.samples_rows.append({
                "prompt_id": key.prompt_id, "epoch": key.epoch, "sample_idx": t.sample_idx,
                "instance": t.instance, "policy_version": ledger(t.policy_version),
                "policy_version_newest": changes[-1][1], "version_changes": changes,
                "weights_step": t.policy_version,
                "weights_step_last": max(t.policy_version, t.policy_version_last),
                "step": ledger_step, "trainer_step": step, "response_len": t.response_len,
                "prompt_len": len(t.prompt_token_ids), "reward": t.reward, "t_finished": t.t_finished,
            })
        self._append(self._samples, self.samples_rows[first:])
        for lag, n in hist.items():
            self.token_lag_hist[lag] = self.token_lag_hist.get(lag, 0) + n
        row = self._row(mb, trajs, out, t0, t1, waited_s, step, lags)
        row.update(token_lag_metrics(hist))
        if self.cfg.multi_turn.enable:
            from asp_npu.rollout.multi_turn import multi_turn_metrics

            row.update(multi_turn_metrics(trajs))
        row.update(baseline_metrics(trajs))
        row[M.LAG_NEWEST_MAX] = float(max(ledger_step - v for v in newest.values()))
        self.versions.append((t1, step + 1))
        self.step_ends.append(t1)
        if (step + 1) % self.shape.steps_per_window == 0:
            self.iterations.append(t1)
        self.last_step_end = t1
        return row

    def _row(self, mb: Minibatch, trajs: list[Trajectory], out: dict[str, float], t0: float, t1: float,
             waited_s: float, step: int, lags: list[int]) -> dict[str, Any]:
        lens = [t.response_len for t in trajs]
        it_s = t1 - self.last_step_end
        row: dict[str, Any] = {
            "iteration": step // self.shape.steps_per_window,
            "policy_version": step + 1,
            "samples/consumed": (step + 1) * self.shape.minibatch,
            M.TIMING_ROLLOUT: waited_s,
            M.TIMING_UPDATE: t1 - t0,
            M.TIMING_ITERATION: it_s,
            M.E2E_TPS: sum(lens) / it_s if it_s > 0 else 0.0,
            M.VLLM_TPS: self.arrived_tokens / it_s / self.shape.instances if it_s > 0 else 0.0,
            M.RESPONSE_LEN_MEAN: float(np.mean(lens)),
            M.RESPONSE_LEN_MAX: float(max(lens)),
            M.RESPONSE_LEN_MIN: float(min(lens)),
            M.REWARD_MEAN: float(np.mean([t.reward for t in trajs])),
            "reward/verifier_failures": sum(t.reward_failures for t in trajs),
            M.LAG_MEAN: float(np.mean(lags)),
            M.LAG_MAX: float(max(lags)),
            "async/staleness_steps_max": float(max(step - t.policy_version for t in trajs)),
            M.QUEUE_OCCUPANCY: mb.queued_before * self.shape.group_size,
            M.TRAINER_IDLE: 1.0 - (t1 - t0) / it_s if it_s > 0 else 0.0,
            **{k if k.startswith("critic/") else f"actor/{k}": v for k, v in out.items()
               if isinstance(v, int | float)},  # the critic's in verl's names (PPO)
        }
        self.arrived_tokens = 0
        return row

    def log(self, step: int, row: dict[str, Any]) -> None:
        self.metrics.log(step, row)

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """A failure or recovery: kept for the summary and appended to `run_log.jsonl` at once."""
        row = {"t": time.time(), "event": kind, **fields}
        self.run_log.append(row)
        self._append(self._log, [row])
        return row

    @staticmethod
    def _append(f: IO[str] | None, rows: list[dict[str, Any]]) -> None:
        if f is None or f.closed:
            return
        for r in rows:
            f.write(json.dumps(r) + "\n")
        f.flush()

    def finish(self, stats: list[dict[str, Any]], series: dict[str, Any], t_end: float, steps: int,
               unit_labels: dict[int, str], placement: dict[str, Any] | None, planned: dict[str, Any]
               ) -> dict[str, Any]:
        """Write events, timeline, queue series, samples and summary.json; returns the summary."""
        from asp_npu.observe import timeline
        from asp_npu.observe.bubbles import account

        sh, G = self.shape, self.shape.group_size
        self.end_lent(t_end)
        for rec in self.instances:
            rec.close(t_end)
        log = build_event_log(stats, self.instances, self.trainer, sh.slots, sh.trainer_world,
                              sh.mode.colocated, self.t_start, t_end, series, self.versions, self.iterations,
                              unit_labels, G)
        log.meta = {"mode": sh.mode.name, "label": self.label}
        log.write(self.run_dir / rd.EVENTS)
        timeline.write_timeline(self.run_dir / rd.TIMELINE, log, self.t_start, t_end)
        rep = account(log, self.t_start, t_end)
        self.run_dir.write_jsonl(rd.QUEUE, [{"t": t, "occupancy": n * G}
                                            for t, n in zip(series["t"], series["queued"], strict=False)])
        bubbles = {"utilization": rep.utilization, **rep.bubbles()}
        extra = {f"bubbles/{k}": v for k, v in bubbles.items()}
        extra.update({M.TRAINER_IDLE: rep.trainer_idle_ratio, M.ROLLOUTER_IDLE: rep.rollouter_idle_ratio})
        totals = self._totals(t_end, steps)
        against = self.against_limit(stats, totals)
        extra.update({k: v for k, v in ((M.X_LIMIT, against.get("x_limit")), (M.MFU, against.get("mfu")))
                      if v is not None})
        self.metrics.log(steps, {"final": 1, **extra}, console=False)
        summary = {"mode": sh.mode.name, "label": self.label, "max_lag": sh.max_lag,
                   "instances": sh.instances, "placement": placement, **totals, "against_limit": against,
                   "bubbles": bubbles, "trainer_idle_ratio": rep.trainer_idle_ratio,
                   "rollouter_idle_ratio": rep.rollouter_idle_ratio, "bubble_coverage": rep.coverage,
                   "weight_refresh_s_mean": float(np.mean([r["total_s"] for r in self.refreshes]))
                   if self.refreshes else 0.0,
                   "queue": series["summary"], **planned,
                   "weight_transfer": self.weights.describe() if self.weights is not None else None}
        self.run_dir.write_summary(summary)
        return summary

    def against_limit(self, stats: list[dict[str, Any]], totals: dict[str, Any]) -> dict[str, Any]:
        """`x limit` and MFU from this run's own measurements (asp_npu/pipeline/efficiency.py); where
        they cannot be computed, None with the reason."""
        import yaml

        from asp_npu.errors import UserError
        from asp_npu.pipeline import efficiency as eff
        from asp_npu.trainer.calibrate import matmul_flops_per_s

        updates = [float(r[M.TIMING_UPDATE]) for r in self.metrics.history if M.TIMING_UPDATE in r]
        ids = [int(st["instance"]) for st in stats]
        frozen = [self.instances[i].frozen if i < len(self.instances) else [] for i in ids]
        decode = eff.decode_fit([st.get("sequence_events", []) for st in stats], self.shape.slots, frozen)
        if decode is None or not self.samples_rows or not updates or not totals["iterations"]:
            return {"x_limit": None, "mfu": None,
                    "why": "no whole iteration or no generated sequence recorded"}
        try:
            raw = yaml.safe_load((self.run_dir / rd.CONFIG).read_text(encoding="utf-8")) or {}
            out = eff.against_limit(raw, self.samples_rows, updates, decode, totals["iteration_time_mean_s"],
                                    totals["iterations"])
            flops = eff.trained_flops(self.policy_path, self.samples_rows,
                                      max(1, self.cfg.actor_config.ppo_epochs))
        except (UserError, KeyError, ValueError) as exc:
            return {"x_limit": None, "mfu": None, "why": str(exc)}
        peak = sorted(matmul_flops_per_s(min_s=0.2) for _ in range(3))[1]
        out.update(mfu=eff.mfu(flops, sum(updates), out["layout"]["trainer_devices"], peak),
                   trained_flops=flops, update_s=sum(updates), matmul_flops_per_s=peak)
        return out

    def _totals(self, t_end: float, steps: int) -> dict[str, Any]:
        rows = self.samples_rows
        tokens = sum(r["response_len"] for r in rows)
        span = (self.step_ends[-1] if self.step_ends else t_end) - self.t_start
        it_ends = [self.t_start, *self.iterations]
        it_times = [b - a for a, b in zip(it_ends, it_ends[1:], strict=False)]
        rewards = [r for r in (row.get(M.REWARD_MEAN) for row in self.metrics.history) if r is not None]
        lags = [r["step"] - r["policy_version"] for r in rows]
        newest: dict[tuple[str, int], tuple[int, int]] = {}
        for r in rows:  # per group: (step, newest version of any of its tokens)
            g = (r["prompt_id"], r["epoch"])
            newest[g] = (r["step"], max(newest.get(g, (0, -1))[1], r.get("policy_version_newest", -1)))
        hist = dict(sorted(self.token_lag_hist.items()))
        rl = self.cfg.rl_config
        return {
            "steps": steps, "iterations": len(self.iterations), "samples": len(rows), "tokens": tokens,
            "wall_s": span,
            "throughput_tokens_per_s": tokens / span if span > 0 else 0.0,
            "throughput_samples_per_s": len(rows) / span if span > 0 else 0.0,
            "iteration_time_mean_s": float(np.mean(it_times)) if it_times else 0.0,
            "step_time_mean_s": span / max(1, steps),
            "final_reward": float(np.mean(rewards[-max(1, len(rewards) // 4):])) if rewards else 0.0,
            "reward_curve": rewards,
            "lag_max": max(lags) if lags else 0,
            "lag_mean": float(np.mean(lags)) if lags else 0.0,
            "lag_newest_max": max((st - v for st, v in newest.values()), default=0),
            "partial_rollout": rl.partial_rollout,
            "max_token_lag": token_lag_bound(rl.partial_rollout, rl.max_token_lag, self.shape.max_lag)
            or self.shape.max_lag,
            "token_lag_max": max(hist, default=0),
            "token_lag_mean": sum(k * n for k, n in hist.items()) / max(1, sum(hist.values())),
            "token_lag_hist": {str(k): n for k, n in hist.items()},
        }

    def close(self) -> None:
        for f in (self._samples, self._log):
            if f is not None:
                close_synced(f)
        self.metrics.close()
