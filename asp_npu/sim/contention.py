"""Rollout and training sharing cores: each slows the other while both are busy.

Why: on a CPU machine (and on any node where engines and trainer contend for memory bandwidth or
host cores) an asynchronous mode's decode steps and trainer steps run slower while they overlap than
either does alone. `asp-npu calibrate` measures both slowdowns in the run's placement
(`cost.share_decode_slowdown`, `cost.share_train_slowdown`: paired shared/alone ratios). Here they
enter the simulation as a mean field: a run is simulated, the fraction of decode time that overlapped
a trainer step (o_r) and of trainer time that overlapped decoding (o_t) are read from its event log,
and the next run's costs are `decode x (1 + (s_d - 1) o_r)` and `train x (1 + (s_t - 1) o_t)`, until
the mean iteration time moves by less than 0.5% (at most `MAX_ROUNDS` runs; damped by averaging each
new factor with the previous one). Colocated modes alternate rollout and training, so nothing
overlaps and they are simulated once. Nothing here is fitted to a run: both slowdowns are measured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from asp_npu.observe.events import EventLog
from asp_npu.sim.cost import SimCost

MAX_ROUNDS = 8
TOLERANCE = 0.005


def _intervals(changes: list[tuple[float, bool]], t_end: float) -> list[tuple[float, float]]:
    """Piecewise-constant on/off records (time, on) -> merged [start, end) intervals where on."""
    out: list[tuple[float, float]] = []
    start = None
    for t, on in sorted(changes, key=lambda x: x[0]):
        if on and start is None:
            start = t
        elif not on and start is not None:
            if t > start:
                out.append((start, t))
            start = None
    if start is not None and t_end > start:
        out.append((start, t_end))
    return out


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two sorted, merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap_fractions(log: EventLog) -> tuple[float, float]:
    """(share of instance decode time during a trainer step, share of trainer step time during
    decoding on any instance) of one simulated run."""
    t_end = log.t_end
    busy = _intervals([(t, s == "busy") for t, s, _ in log.trainer], t_end)
    per_inst: dict[int, list[tuple[float, bool]]] = {}
    for t, i, running, state in log.inst:
        per_inst.setdefault(i, []).append((t, running > 0 and state not in ("paused", "lent")))
    decode = {i: _intervals(ch, t_end) for i, ch in per_inst.items()}
    dec_total = sum(b - a for spans in decode.values() for a, b in spans)
    o_r = sum(_overlap(spans, busy) for spans in decode.values()) / dec_total if dec_total > 0 else 0.0
    any_decode = _union([s for spans in decode.values() for s in spans])
    busy_total = sum(b - a for a, b in busy)
    o_t = _overlap(busy, any_decode) / busy_total if busy_total > 0 else 0.0
    return float(o_r), float(o_t)


def shared_cost(base: SimCost, o_r: float, o_t: float) -> SimCost:
    """`base` with the decode and trainer costs raised for the given overlap fractions."""
    fd = 1.0 + (base.share_decode_slowdown - 1.0) * o_r
    ft = 1.0 + (base.share_train_slowdown - 1.0) * o_t
    return replace(
        base,
        decode_a=base.decode_a * fd,
        decode_b=base.decode_b * fd,
        decode_c=base.decode_c * fd,
        train_s_per_token=base.train_s_per_token * ft,
        train_step_s=base.train_step_s * ft,
        share_decode_slowdown=1.0,
        share_train_slowdown=1.0,
    )


def simulate_shared(
    base: SimCost, colocated: bool, run: Callable[[SimCost], Any], iteration_s: Callable[[Any], float]
) -> tuple[Any, dict[str, Any]]:
    """Run `run(cost)` to the mean-field fixed point (module docstring); returns the last result and
    what the sharing did (factors, overlaps, rounds). `iteration_s(result)` is its mean iteration time.
    A colocated mode runs once, its decode at `colocated_decode_slowdown` (all instances decode at once)."""
    sharing = base.share_decode_slowdown > 1.0 or base.share_train_slowdown > 1.0
    if colocated:
        f = base.colocated_decode_slowdown
        co = replace(base, decode_a=base.decode_a * f, decode_b=base.decode_b * f,
                     decode_c=base.decode_c * f, share_decode_slowdown=1.0, share_train_slowdown=1.0,
                     colocated_decode_slowdown=1.0)
        info: dict[str, Any] = {"applied": False}
        if f > 1.0:
            info["colocated_decode_slowdown"] = f
        return run(co), info
    if not sharing:
        plain = replace(base, share_decode_slowdown=1.0, share_train_slowdown=1.0)
        return run(plain), {"applied": False}
    o_r = o_t = 0.0
    res = run(shared_cost(base, o_r, o_t))
    prev = iteration_s(res)
    history = [prev]
    for _ in range(MAX_ROUNDS - 1):
        n_r, n_t = overlap_fractions(res.log)
        o_r, o_t = (o_r + n_r) / 2, (o_t + n_t) / 2
        res = run(shared_cost(base, o_r, o_t))
        cur = iteration_s(res)
        history.append(cur)
        if abs(cur - prev) <= TOLERANCE * max(prev, 1e-12):
            break
        prev = cur
    return res, {
        "applied": True,
        "decode_slowdown": base.share_decode_slowdown,
        "train_slowdown": base.share_train_slowdown,
        "decode_overlap": o_r,
        "train_overlap": o_t,
        "decode_factor": 1.0 + (base.share_decode_slowdown - 1.0) * o_r,
        "train_factor": 1.0 + (base.share_train_slowdown - 1.0) * o_t,
        "iteration_s_by_round": history,
    }
