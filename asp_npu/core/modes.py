"""The one mode table: ASP and the baselines it is compared with, for the simulator and the Ray pipeline.

Every mode gets the same devices, prompts, seeds and minibatch; a row says only what the systems
differ in. The real pipeline and the simulator read the same row; where the simulator models the peer
system more closely than our real pipeline runs it, the `sim_*`/`deal`/`partial_rollout` fields say so.

- `asp`            offline ASP plan per window (padding -> skewness -> sorting); unit admission: each
                   instance runs its own ordered units (static feed); continuous admission: the window's
                   groups stream out through `schedule.dispatch.StreamDispatcher` (stream feed);
                   asynchronous, lag bounded by `rl_config.max_lag`, refresh every `weight_refresh_interval`.
- `async-fifo`     the same asynchronous pipeline with FIFO units pulled by whichever instance is free
                   ("scheduling alone" is the gap).
- `one-step-off`   verl one-step off-policy: the next global batch generates with the previous weights
                   while the trainer trains; one weight sync per global batch (lag 1).
- `sortedrl`       online length-aware (SortedRL): everything admitted is submitted at once, the trainer
                   takes the shortest finished groups first, the same lag cache. The simulator models its
                   colocated partial rollout (preempt + resume); the real pipeline keeps long samples
                   generating on their own devices.
- `mindspeed-sync` MindSpeed-RL integrated worker: colocated, strictly alternating; per global batch the
                   engines wake, refresh, generate it all, sleep, then the trainer runs every minibatch.
- `verl-sync`      verl hybrid engine (simulator only): colocated, requests dealt round robin.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from asp_npu.errors import ConfigError

Dispatch = Literal["static", "pull", "stream"]
FEEDS: tuple[str, ...] = ("static", "pull", "stream")


@dataclass(frozen=True)
class Mode:
    name: str
    planner: str  # "asp" (offline planner) | "fifo" (prompt order, the same unit size)
    dispatch: str  # the feed: "static" (each instance its plan list) | "pull" (next unit to whoever is
    #                free) | "stream" (a group per dispatch, chosen by StreamDispatcher for the asker)
    admission: str  # RolloutInstance admission: "unit" (a unit is one batch) | "continuous"
    queue_order: str  # TrainQueue handout order among due groups: "fifo" | "shortest"
    colocated: bool  # rollout and training alternate on the same devices
    refresh_per_window: bool  # weights refresh once per global batch (a window barrier in the simulator)
    lookahead_units: int = 1  # unit admission: units queued behind the running one
    fixed_lag: int | None = None  # lag bound the mode implies (None: rl_config.max_lag)
    fixed_admission: bool = False  # False: generate_config.admission decides
    real: bool = True  # has a real-engine implementation
    # how the simulator models the peer system where our real pipeline runs it differently
    deal: str = ""  # "chunk" | "round_robin": the batch is dealt to instances up front (sync baselines)
    sim_colocated: bool | None = None  # None: as `colocated`
    partial_rollout: bool = False  # colocated preemption + resume under new weights (SortedRL)
    trainer_padded: bool = False  # fixed micro-batches padded to their longest (MindSpeed-RL trainer)
    steal: bool = False  # static feed: an idle instance takes the oldest window's undispatched units

    @property
    def colocated_in_sim(self) -> bool:
        return self.colocated if self.sim_colocated is None else self.sim_colocated

    def allows_partial(self, max_lag: int | None = None, simulated: bool = False) -> bool:
        """The partial-rollout rule, its one home: unfinished sequences carry on across weight refreshes
        only on their own devices with a nonzero lag, an asynchronous disaggregated mode (SortedRL's
        colocated preempt-and-resume is its own mode). `max_lag` is the run's when the mode fixes none;
        `simulated` reads the mode as the simulator models it."""
        colocated = self.colocated_in_sim if simulated else self.colocated
        lag = self.fixed_lag if self.fixed_lag is not None else max_lag
        return not colocated and lag != 0


TABLE: dict[str, Mode] = {
    "mindspeed-sync": Mode("mindspeed-sync", "fifo", "pull", "continuous", "fifo", True, True,
                           fixed_lag=0, fixed_admission=True, deal="chunk", trainer_padded=True),
    "verl-sync": Mode("verl-sync", "fifo", "pull", "continuous", "fifo", True, True,
                      fixed_lag=0, fixed_admission=True, real=False, deal="round_robin"),
    "one-step-off": Mode("one-step-off", "fifo", "pull", "unit", "fifo", False, True, fixed_lag=1,
                         deal="round_robin"),
    "async-fifo": Mode("async-fifo", "fifo", "pull", "unit", "fifo", False, False),
    "sortedrl": Mode("sortedrl", "fifo", "pull", "continuous", "shortest", False, False,
                     fixed_admission=True, sim_colocated=True, partial_rollout=True),
    "asp": Mode("asp", "asp", "static", "unit", "fifo", False, False, steal=True),
}

MODES: tuple[str, ...] = tuple(TABLE)  # every mode (the simulator runs all of them)
BASELINES: tuple[str, ...] = tuple(m for m in MODES if m != "asp")
REAL_MODES: tuple[str, ...] = ("asp", "async-fifo", "one-step-off", "sortedrl", "mindspeed-sync")
COLOCATED_MODES: tuple[str, ...] = tuple(m for m in MODES if TABLE[m].colocated)
assert set(REAL_MODES) == {m for m in MODES if TABLE[m].real}


def mode_spec(name: str, admission: str | None = None) -> Mode:
    """The mode's row; `admission` (generate_config.admission) applies where the mode lets it, and
    ASP under continuous admission streams its groups instead of running its static plan."""
    if name not in TABLE or not TABLE[name].real:
        raise ConfigError(
            f"rl_config.mode: '{name}' has no real-engine implementation (choose {', '.join(REAL_MODES)})"
        )
    return resolve(TABLE[name], admission)


def resolve(mode: Mode, admission: str | None) -> Mode:
    if admission is None or mode.fixed_admission:
        return mode
    mode = replace(mode, admission=admission)
    if mode.planner == "asp" and admission == "continuous":
        mode = replace(mode, dispatch="stream")
    return mode


def sim_mode(name: str, executor: str) -> Mode:
    """The row the simulator runs: its `stream` executor is continuous admission, `unit` unit admission."""
    if name not in TABLE:
        raise ConfigError(f"unknown mode '{name}' (modes: {', '.join(MODES)})")
    return resolve(TABLE[name], "continuous" if executor == "stream" else "unit")


def instances_on(num_instances: int, infer_tp: int, colocated: bool, devices: int) -> int:
    """Rollout instances on `devices` devices (CPU: cores): a colocated mode generates on every device,
    one instance per `infer_tp` of them (MindSpeed-RL's integrated worker, verl's hybrid engine);
    an asynchronous mode runs `num_instances` on its rollout devices."""
    return max(num_instances, devices // infer_tp) if colocated else num_instances


def max_lag(configured: int, mode: Mode) -> int:
    """The lag bound a run keeps: the mode's own (one-step-off 1, synchronous 0) or the configured one."""
    return configured if mode.fixed_lag is None else mode.fixed_lag
