"""One bubble accounting (ARCHITECTURE.md section 5) over an `EventLog`, for simulated and real runs alike.

Every device-second of the job lands in exactly one bucket, so `utilization + padding + skewness +
sorting + overhead == 1` by construction (checked: `coverage` is accounted / (devices x span)).
An instance of `d` devices and `S` slots running `r` sequences contributes `d*r/S` useful devices; its
`d*(S-r)/S` idle ones are:

- **padding**: the instance still has running sequences (the tail of a unit or of its share) and no
  further work is admitted -- plus trainer device time spent on padded / imbalanced tokens;
- **skewness**: the instance has no work left in the iteration and nothing running, while another
  instance still generates;
- **sorting**: back-pressure (queue full / lag bound), the trainer waiting for a complete minibatch,
  and rollout devices waiting for the pipeline while no instance generates;
- **overhead**: weight refresh, resharding, offload/onload (paused).

`trainer_idle_ratio` = share of wall time the trainer devices do no training compute (waiting,
refresh, switching, or lent to rollout); `rollouter_idle_ratio` = 1 - useful slot time / all slot time
of the rollout devices over the whole span (a colocated device training counts as a not-generating
rollout device). Both are honest: a slow synchronous run cannot read as "not idle" (verl #6693).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from asp_npu.observe.events import EventLog

BUCKETS = ("useful", "padding", "skewness", "sorting", "overhead")
_U, _P, _K, _S, _O = range(5)


@dataclass
class BubbleReport:
    utilization: float
    padding: float
    skewness: float
    sorting: float
    overhead: float
    trainer_idle_ratio: float
    rollouter_idle_ratio: float
    device_seconds: float
    span_s: float
    coverage: float  # accounted device-seconds / (devices x span); 1.0 for a consistent log

    def bubbles(self) -> dict[str, float]:
        return {
            "padding": self.padding,
            "skewness": self.skewness,
            "sorting": self.sorting,
            "overhead": self.overhead,
        }

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _instance_rates(d: int, slots: int, running: int, state: str) -> tuple[list[float], float, int]:
    """(bucket rates in devices, devices idle-and-empty awaiting attribution, generating flag)."""
    rates = [0.0] * 5
    if state == "lent":
        return rates, 0.0, 0
    if state == "paused":
        rates[_O] = d
        return rates, 0.0, 0
    r = min(running, slots)
    busy = d * r / slots
    idle = d - busy
    rates[_U] = busy
    if state == "blocked":
        rates[_S] = idle
    elif state == "drained" and r == 0:
        return rates, float(idle), 0
    else:  # run, or drained with its own sequences still running
        rates[_P] = idle
    return rates, 0.0, int(r > 0)


def _trainer_rates(devices: int, state: str, useful: float) -> list[float]:
    rates = [0.0] * 5
    if state == "busy":
        rates[_U] = devices * useful
        rates[_P] = devices * (1.0 - useful)
    elif state == "wait":
        rates[_S] = devices
    elif state == "paused":
        rates[_O] = devices
    return rates


class _Integrator:
    """The running state rates of `account`: device-seconds per bubble kind accrue at `rate`."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        n_inst = len(log.instance_devices)
        self.cur = [[0.0] * 5 for _ in range(n_inst)]
        self.cur_empty = [0.0] * n_inst
        self.cur_gen = [0] * n_inst
        self.tr_cur = [0.0] * 5
        self.total = [0.0] * 5
        self.rate = [0.0] * 5
        self.empty = 0.0
        self.generating = 0
        self.trainer_busy_s = 0.0
        self.trainer_busy = False
        self.rollout_useful = 0.0
        self.rollout_useful_rate = 0.0

    def advance(self, dt: float) -> None:
        for k in range(5):
            self.total[k] += self.rate[k] * dt
        self.total[_K if self.generating else _S] += self.empty * dt
        self.rollout_useful += self.rollout_useful_rate * dt
        if self.trainer_busy:
            self.trainer_busy_s += dt

    def instance(self, i: int, running: int, state: str) -> None:
        log = self.log
        new, new_empty, gen = _instance_rates(log.instance_devices[i], log.instance_slots[i], running, state)
        old = self.cur[i]
        for k in range(5):
            self.rate[k] += new[k] - old[k]
        self.rollout_useful_rate += new[_U] - old[_U]
        self.empty += new_empty - self.cur_empty[i]
        self.generating += gen - self.cur_gen[i]
        self.cur[i], self.cur_empty[i], self.cur_gen[i] = new, new_empty, gen

    def trainer(self, state: str, util: float) -> None:
        new = _trainer_rates(self.log.trainer_devices, state, util)
        for k in range(5):
            self.rate[k] += new[k] - self.tr_cur[k]
        self.tr_cur = new
        self.trainer_busy = state == "busy"


def account(log: EventLog, t0: float = 0.0, t1: float | None = None) -> BubbleReport:
    """Integrate the log's piecewise-constant states over [t0, t1] (default: the whole run)."""
    t1 = log.t_end if t1 is None else t1
    span = max(0.0, t1 - t0)
    # merged, time-ordered stream; the index keeps insertion order among equal times
    stream: list[tuple[float, int, int, int, float, str]] = [
        (t, 0, k, i, r, s) for k, (t, i, r, s) in enumerate(log.inst)
    ]
    stream += [(t, 1, k, -1, u, s) for k, (t, s, u) in enumerate(log.trainer)]
    stream.sort(key=lambda e: (e[0], e[1], e[2]))
    acc_state = _Integrator(log)
    t_prev = t0
    for t, kind, _, i, r, s in stream:
        a, b = max(t_prev, t0), min(t, t1)
        if b > a:
            acc_state.advance(b - a)
        t_prev = max(t_prev, t)
        if kind == 0:
            acc_state.instance(i, int(r), s)
        else:
            acc_state.trainer(s, float(r))
    if t1 > t_prev:
        acc_state.advance(t1 - max(t_prev, t0))
    total = acc_state.total
    acc = sum(total)
    frac = [x / acc if acc > 0 else 0.0 for x in total]
    rollout_dev_s = sum(log.instance_devices) * span
    return BubbleReport(
        utilization=frac[_U],
        padding=frac[_P],
        skewness=frac[_K],
        sorting=frac[_S],
        overhead=frac[_O],
        trainer_idle_ratio=1.0 - acc_state.trainer_busy_s / span if span > 0 else 0.0,
        rollouter_idle_ratio=1.0 - acc_state.rollout_useful / rollout_dev_s if rollout_dev_s > 0 else 0.0,
        device_seconds=acc,
        span_s=span,
        coverage=acc / (log.devices * span) if log.devices and span > 0 else 0.0,
    )
