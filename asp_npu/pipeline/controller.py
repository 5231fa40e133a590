"""The pipeline controller: the training loop over the fleet, the feed, the weights and the recorder.

One process (the driver) runs the loop; the engines, the trainer ranks and the TrainQueue are Ray
actors (`fleet.py`). Per planning window (one global batch of `rl_config.global_batch_size` prompts =
one iteration) the window planner (`asp_npu.core.window`) predicts and plans units; asynchronous modes
then (1) dispatch units as far ahead as the mode allows (`asp_npu.core.policy`), each admitted whole by
the TrainQueue at the weights version its instance holds (bounded lag: prevent, never discard);
(2) wait for finished groups (streamed into the queue actor) and feed their lengths to the predictor;
(3) when the trainer is free, take a complete minibatch and run the step in a worker thread; (4) every
k steps also gather the new weights, published once and loaded by every instance between two engine
steps (`weights.py`), no global stop.

`mindspeed-sync` alternates instead: generate the whole window, pause engines, train every step,
resume + refresh. Output: the run directory (`recorder.py`); checkpoints and resume: `resume.py`.
DAPO dynamic sampling: groups the queue actor filtered are replaced by more prompts (`plan_window`).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from asp_npu.config import Config
from asp_npu.core import run_dir as rd
from asp_npu.core.feed import make_feed
from asp_npu.core.modes import mode_spec
from asp_npu.core.policy import DispatchPolicy, Ports
from asp_npu.core.records import Arrival, Minibatch, Unit
from asp_npu.core.window import GroupSupply, WindowPlanner, window_stream
from asp_npu.errors import UserError
from asp_npu.pipeline import resume
from asp_npu.pipeline.derived import RunDerived
from asp_npu.pipeline.fleet import Fleet
from asp_npu.pipeline.recorder import Recorder
from asp_npu.pipeline.recovery import Supervisor
from asp_npu.pipeline.validation import Validator
from asp_npu.predict.factory import make_run_predictor
from asp_npu.predict.trajectory import TrajectoryPredictor
from asp_npu.schedule.cost import CostModel
from asp_npu.schedule.planner import PlannerConfig
from asp_npu.types import PromptItem, TrainBatch
from asp_npu.weights.refresh import WeightSync, make_weights, refresh_all_and_wait

WAIT_S = 1.0  # longest block between events (and between looks at `stop_signal`)

__all__ = ["Controller", "window_stream"]


def observe_arrival(predictor: Any, r: Arrival) -> None:
    """Feed a finished group to the predictor: a multi-turn group as whole trajectories (model tokens,
    turns, tool-wait seconds) when the predictor is the trajectory one, else each response length."""
    key = r.key
    if isinstance(predictor, TrajectoryPredictor) and r.turns:
        n = len(r.turns)
        predictor.observe_trajectories([key.prompt_id] * n, [key.epoch] * n, list(r.model_lens),
                                       list(r.turns), list(r.tool_s), [r.prompt_len] * n)
        return
    for n in r.lens:
        predictor.observe(key.prompt_id, key.epoch, int(n), int(r.prompt_len))


class Controller:
    """Owns the parts of one run; `run()` trains `trainer.train_iters` iterations and returns the summary."""

    def __init__(self, cfg: Config, run: rd.RunDir, prompts: list[PromptItem], kind: str = "cpu",
                 console: bool = True, label: str = "", derived: RunDerived | None = None) -> None:
        """`cfg` as loaded (only read); `derived`: the policy and resume point start-up derived (None:
        those `cfg` names), completed by the fleet's placement (`self.derived`)."""
        rl = cfg.rl_config
        self.cfg, self.run_dir, self.prompts = cfg, run, prompts
        self.mode = mode_spec(rl.mode, cfg.generate_config.admission)
        self.fleet = Fleet(cfg, kind, self.mode, derived)
        self.derived = self.fleet.derived
        self.validator = Validator(cfg, self.fleet, lambda r: self.recorder.metrics.log(self.step, r, False))
        self.shape = sh = self.fleet.shape
        self.recorder = Recorder(cfg, run, sh, label, console, self.derived)
        feed = make_feed(self.mode.dispatch, sh.instances, sh.version_groups)
        self.policy = DispatchPolicy(feed, self.mode, sh.instances, sh.slots)
        base = PlannerConfig(num_instances=sh.instances, minibatch=sh.minibatch, group_size=sh.group_size,
                             max_num_seqs=sh.slots, max_lag=sh.max_lag,
                             cost=CostModel(rl.plan_cost_a, rl.plan_cost_b, 0.0))
        # multi-turn: the trajectory predictor, its tool waits counted in the cost model's full-batch steps
        self.predictor = make_run_predictor(rl.predictor, cfg.multi_turn.enable,
                                            base.cost.step_seconds(sh.slots))
        self.planner = WindowPlanner(self.mode, sh.group_size, base, self.predictor,
                                     lambda _mean, _plen: self.recorder.train_step_s)
        self.window_items = window_stream(prompts, sh.window, cfg.data.seed)
        self.plan_summaries: dict[int, dict[str, Any]] = {}
        self.next_window = 0
        self.step = 0  # trainer steps done = the weights version the trainer holds
        self.base = 0  # step a resumed run continues after (`actor_config.load`); the ledger counts from it
        self.saved = 0  # step of the last checkpoint
        self.stop_signal: str | None = None  # set by SIGTERM/SIGINT: checkpoint and stop (resume.py)
        self.resumed_pending: int | None = None  # groups a resumed window still needs generated
        self.weights: WeightSync | None = None
        self.arrivals_seen = 0
        self.supply = GroupSupply()  # groups planned / filtered by DAPO dynamic sampling
        self._tokenizer: Any = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asp-trainer")
        self.supervisor = Supervisor(cfg, self.fleet, self.policy, self.recorder)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """The actors (engines warmed up off the clock), the weights seam, then a resumed checkpoint."""
        self.fleet.start(self.prompts[0])
        self.weights = make_weights(self.cfg.generate_config.weight_transfer, self.fleet.trainer,
                                    self.fleet.instances, self.cfg.model.dtype, self.fleet.drain,
                                    self.fleet.kind, self.mode.colocated)
        self.supervisor.attach(self.weights)
        if any(p.prompt_token_ids is None for p in self.prompts):
            self._tok()  # loading the tokenizer (importing transformers) takes seconds: not on the clock
        if self.derived.resume_from:  # trainer, queue, ledger, data position, predictor
            resume.restore(self, self.derived.resume_from)
            self._publish()
            refresh_all_and_wait(self.weights, self.recorder.refreshed)

    def close(self) -> None:
        """Never hangs: a trainer step still running is abandoned (its actors are killed by the fleet)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        try:
            if self.weights is not None and hasattr(self.weights, "close"):
                self.weights.close()
        finally:
            try:
                self.fleet.close()
            finally:
                self.recorder.close()

    # ------------------------------------------------------------------ planning and dispatch
    def _tok(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.derived.policy_path)
        return self._tokenizer

    def prompt_len(self, item: PromptItem) -> int:
        from asp_npu.data.datasets import encode_prompt

        ids = item.prompt_token_ids
        return len(ids if ids is not None else encode_prompt(item, self._tok()))

    def plan_window(self) -> bool:
        """Predict, plan and feed the next window's units while the groups planned minus those filtered
        fall short of the run's (colocated: the iteration's) groups; cut to the shortfall. False: none."""
        sh = self.shape
        windows = self.step // sh.steps_per_window + 1 if self.mode.colocated else sh.iterations
        short = self.supply.shortfall(windows * sh.window)
        if short <= 0:
            return False
        self.next_window += 1
        self.plan_items(self.next_window - 1, self.window_items(self.next_window - 1)[:short])
        return True

    def plan_items(self, w: int, items: list[PromptItem]) -> None:
        """Plan and feed `items` (window `w`'s prompts, or those a resumed run still needs)."""
        plens = np.array([self.prompt_len(it) for it in items], dtype=np.int64)
        base_ids = np.array([it.meta["base_id"] for it in items], dtype=str)
        wp = self.planner.plan(w, [it.prompt_id for it in items], base_ids, plens, self.cfg.data.seed + w)
        assert wp.plan is not None
        wp.plan.write_json(self.run_dir.plans / f"window_{w:04d}.json")
        self.plan_summaries[w] = dict(wp.plan.summary)
        self.policy.add_window(wp.units)
        self.fleet.add_prompts(items)
        self.supply.planned += len(items)

    def _ledger_version(self, weights_step: int) -> int:
        """The lag ledger's version of weights after `weights_step` trainer steps (counted from `base`)."""
        return (weights_step - self.base) // self.shape.steps_per_version

    def dispatch(self) -> None:
        assert self.weights is not None
        now, held = time.time(), self.weights.held

        def admit(unit: Unit, i: int) -> bool:
            return self.fleet.admit(unit, self._ledger_version(held[i]), i)

        def blocked(i: int, on: bool) -> None:
            self.recorder.instances[i].set_blocked(now, on)

        # work runs dry: an asynchronous mode plans its next window, a colocated one only replacements
        # of filtered groups (it plans each iteration's window itself)
        self.policy.dispatch(Ports(admit, self.fleet.submit, blocked, self.plan_window))

    def _wait_events(self, timeout: float) -> list[Arrival]:
        """Block until a group arrives, a weight load ends or the trainer wakes the queue (or `timeout`);
        returns the new arrivals. The control plane shares the cores with rollout and training on CPU,
        so it sleeps between events rather than polling."""
        assert self.weights is not None
        rows, failures = self.fleet.next_arrivals(self.arrivals_seen, timeout, self.weights.pending())
        self.arrivals_seen += len(rows)
        self.recorder.arrived_tokens += sum(r.tokens for r in rows)
        self.supervisor.failed(failures)
        for r in rows:
            self.supply.filtered += r.filtered
            self.policy.arrived(r.group)
            self.supervisor.arrived(r.instance, r.t)
            observe_arrival(self.predictor, r)
        return rows

    # ------------------------------------------------------------------ weights and steps
    def _publish(self, gathered: Any = None) -> None:
        """Publish the trainer's weights (version = its step) for every instance to load."""
        assert self.weights is not None
        g = gathered or self.weights.gather()
        self.weights.publish(g, self.step)
        self.recorder.trainer.paused.append((g.t0, g.t1))

    def _poll_refreshes(self) -> None:
        self.supervisor.check()
        for r in self.supervisor.poll_refreshes():
            self.recorder.refreshed(r)
            self.supervisor.refreshed(r)

    def _train(self, mb: Minibatch, gather: bool = False) -> tuple[dict[str, float], float, float, Any]:
        """One trainer step; with `gather`, also the new weights for a refresh (same thread, in order)."""
        assert self.weights is not None
        t0 = time.time()
        out = self.fleet.train_step(TrainBatch(mb.trajectories, self.shape.group_size, self.step))
        t1 = time.time()
        return out, t0, t1, self.weights.gather() if gather else None

    def _stepped(self, mb: Minibatch, out: dict[str, float], t0: float, t1: float, waited_s: float
                 ) -> dict[str, Any]:
        row = self.recorder.step(mb, out, t0, t1, waited_s, self.step, self.base)
        self.step += 1
        if self.cfg.rl_config.drop_equal_reward_groups:
            row.update(self.supply.metrics(self.step * self.shape.minibatch_groups, len(mb.trajectories)))
        return row

    def _log_and_save(self, row: dict[str, Any]) -> None:
        self.recorder.log(self.step, row)
        if self.validator.mark(self.step, self.shape.total_steps) and not self.mode.colocated:
            assert self.weights is not None  # a colocated run's engines sleep now: it validates on waking
            self.validator.run(self.weights.held)
        f = self.cfg.trainer.save_freq
        if f > 0 and self.step - self.saved >= f and self.step < self.shape.total_steps:
            resume.save(self, "save_freq")

    # ------------------------------------------------------------------ the loops
    def run(self) -> dict[str, Any]:
        self.recorder.start(time.time(), self.step, self.weights)
        (self._run_sync if self.mode.colocated else self._run_async)()
        if self.validator.due:  # a colocated run's last validation: wake the engines with the last weights
            assert self.weights is not None
            self._publish()
            self.fleet.resume()
            refresh_all_and_wait(self.weights, self.recorder.refreshed)
            self.validator.run(self.weights.held)
        t_end = time.time()
        self.supervisor.settle()
        if self.cfg.trainer.save_freq >= 0:
            resume.save(self, "end")
        stats = self.fleet.stats()
        labels = {u.uid: f"w{u.window}/u{u.uid}" for u in self.policy.units.values()}
        planned = {"planned_groups": len(self.policy.group_unit), "windows": self.plan_summaries,
                   "consumed_group_ids": resume.consumed_ids(self),
                   "filtered_group_ids": resume.filtered_ids(self),
                   "planned_samples": self.policy.planned_samples(), "failures": self.supervisor.summary()}
        if isinstance(self.predictor, TrajectoryPredictor):
            planned["predictor"] = self.predictor.summary()
        summary = self.recorder.finish(stats, self.fleet.series(), t_end, self.step, labels,
                                       self.fleet.placement_summary(), planned)
        errors = [e for s in stats for e in s["errors"]]
        if errors:
            summary["instance_errors"] = errors[:20]
        return summary

    def _run_async(self) -> None:
        assert self.weights is not None
        k, total = self.shape.steps_per_version, self.shape.total_steps
        future: Future | None = None
        mb: Minibatch | None = None
        waited_from = last_progress = time.time()
        while self.step < (total := self.shape.total_steps):  # a shorter shape may end the run early
            if self.stop_signal and future is None:
                resume.stop(self)
            self.dispatch()
            if future is None and not self.stop_signal:
                mb = self.fleet.take_batch(0.0)
                if mb is not None:
                    refresh = (self.step + 1) % k == 0 and self.step + 1 < total
                    future = self._pool.submit(self._train, mb, refresh)
                    future.add_done_callback(lambda _f: self.fleet.wake())
                    continue  # the handout may have opened admission
            if self._wait_events(WAIT_S):
                last_progress = time.time()
            self._poll_refreshes()
            if future is not None and future.done():
                assert mb is not None
                out, t0, t1, gathered = future.result()
                row = self._stepped(mb, out, t0, t1, t0 - waited_from)
                future, mb = None, None
                if gathered is not None:
                    self._publish(gathered)
                    self.weights.refresh()
                self._log_and_save(row)
                waited_from = last_progress = time.time()
            self.supervisor.progress_guard(last_progress)

    def _run_sync(self) -> None:
        """MindSpeed-RL integrated worker: generate a whole window, pause engines, train all its steps."""
        assert self.weights is not None
        sh = self.shape
        while self.step < sh.total_steps:
            t_gen = time.time()
            self.recorder.end_lent(t_gen)
            self.fleet.resume()  # wake up: resume engines, load the newest weights everywhere, then generate
            refresh_all_and_wait(self.weights, self.recorder.refreshed)
            if self.validator.due:
                self.validator.run(self.weights.held)
            if self.resumed_pending is None:
                self.plan_window()
            self.resumed_pending = None
            # trained groups this iteration still needs (a resumed one has some queued already)
            left = sh.steps_per_window - self.step % sh.steps_per_window
            need = left * sh.minibatch_groups - int(self.fleet.queue_state()["queued"])
            got, last_progress = 0, time.time()
            while got < need:
                if self.stop_signal:
                    resume.stop(self)
                self.dispatch()
                rows = self._wait_events(WAIT_S)
                if rows:
                    got += sum(not r.filtered for r in rows)
                    last_progress = time.time()
                self.supervisor.progress_guard(last_progress)
            t_pause = time.time()
            self.fleet.pause()  # engines sleep while the trainer runs
            t_train = time.time()
            self.recorder.generated(t_gen, t_pause, t_train)
            for s in range(sh.steps_per_window - self.step % sh.steps_per_window):
                if self.stop_signal:
                    resume.stop(self)
                waited_from = time.time()
                mb = self.fleet.take_batch(30.0)
                if mb is None:
                    raise UserError("mindspeed-sync: the queue refused a minibatch of a generated window")
                out, t0, t1, _ = self._train(mb)
                row = self._stepped(mb, out, t0, t1, t_train - t_gen if s == 0 else t0 - waited_from)
                if self.step % sh.steps_per_window == 0 and self.step < sh.total_steps:
                    self._publish()
                self._log_and_save(row)
