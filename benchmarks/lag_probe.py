"""Where one simulated run's time goes (issue #26's sweep analysis): one mode on one fixed split of the
`paper` preset, with the instance states' time shares (run / blocked = lag capacity 0 / drained = no work /
paused), the trainer's, how much of the trainer's waiting had a whole minibatch queued (held back by
the lag rule for a due straggler), and the groups' generation time (admitted -> last sample finished).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/lag_probe.py --cost 8.1e-4 --instances 16 --trainer 16 \
        [--mode asp] [--set rl.max_lag=8 ...]
"""

from __future__ import annotations

import argparse
import bisect
import sys
from collections import defaultdict

import numpy as np

from asp_npu.core import train_queue
from asp_npu.sim.modes import DeviceSplit
from asp_npu.sim.preset import load_preset
from asp_npu.sim.run import build_workload, simulate_layout


def _value(v: str) -> object:
    if v in ("true", "false"):
        return v == "true"
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return v


def _shares(rows: list[tuple[float, str]], end: float) -> dict[str, float]:
    """Time share of each state of one track of (time, state) changes, up to `end`."""
    out: dict[str, float] = defaultdict(float)
    for j, (t, s) in enumerate(rows):
        t1 = min(rows[j + 1][0] if j + 1 < len(rows) else end, end)
        if t1 > t:
            out[s] += t1 - t
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--cost", type=float, required=True, help="cost.train_s_per_token")
    ap.add_argument("--instances", type=int, required=True)
    ap.add_argument("--trainer", type=int, required=True, help="trainer devices")
    ap.add_argument("--mode", default="asp")
    ap.add_argument("--set", nargs="*", default=[], help="preset overrides key=value")
    a = ap.parse_args(argv)
    overrides: dict[str, object] = {"cost.train_s_per_token": a.cost}
    for kv in a.set:
        if "=" not in kv:
            print(f"lag_probe: --set takes key=value, got {kv!r}", file=sys.stderr)
            return 2
        k, v = kv.split("=", 1)
        overrides[k] = _value(v)
    handed: list[tuple[float, float]] = []  # (admit -> finished seconds) of every handed-out group
    get = train_queue.TrainQueue.get

    def recording_get(self, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202 - a wrapper
        h = get(self, *args, **kw)
        if h is not None:
            handed.extend((g.t_put - g.t_admit, 0.0) for g in h.groups)
        return h

    train_queue.TrainQueue.get = recording_get  # type: ignore[method-assign]
    try:
        preset = load_preset(a.preset, overrides=overrides)
        workload = build_workload(preset)
        d = preset.cluster.infer_tp
        lay = DeviceSplit(a.instances * d + a.trainer, a.instances, d, a.trainer)
        r = simulate_layout(preset, workload, a.mode, lay)
    finally:
        train_queue.TrainQueue.get = get  # type: ignore[method-assign]
    m, log, end = r.metrics, r.result.log, r.result.wall_s
    lim = m["limit"]
    floor = lim["lag_floor_iteration_s"]
    print(f"{a.mode} {lay}: {m['throughput_tokens_per_s']:.0f} tokens/s, "
          f"iteration {m['iteration_time_mean_s']:.1f} s, x limit {m['efficiency']:.3f}, "
          f"x hardware {m['efficiency_hardware']:.3f}, lag floor {floor:.1f} s = "
          f"{floor / lim['hardware_iteration_s']:.3f} x hardware")
    tracks: dict[int, list[tuple[float, str]]] = defaultdict(list)
    running = 0.0
    for t, i, _n, s in log.inst:
        tracks[i].append((t, s))
    inst: dict[str, float] = defaultdict(float)
    for i, rows in tracks.items():
        for k, v in _shares(rows, end).items():
            inst[k] += v
        ns = [(t, n) for t, j, n, _ in log.inst if j == i]
        for j, (t, n) in enumerate(ns):
            t1 = min(ns[j + 1][0] if j + 1 < len(ns) else end, end)
            running += n * max(0.0, t1 - t)
    tot = sum(inst.values())
    print("instances: " + ", ".join(f"{k} {v / tot:.3f}" for k, v in sorted(inst.items()))
          + f"; mean running sequences per instance {running / tot:.1f}")
    tr = _shares([(t, s) for t, s, _ in log.trainer], end)
    print("trainer: " + ", ".join(f"{k} {v / end:.3f}" for k, v in sorted(tr.items())))
    q = log.queue_occ
    qt = [x[0] for x in q]
    mbg = r.result.spec.minibatch_groups
    wait = held = 0.0
    for j, (t, s, _) in enumerate(log.trainer):
        t1 = log.trainer[j + 1][0] if j + 1 < len(log.trainer) else end
        if s == "wait" and t1 > t:
            wait += t1 - t
            i = bisect.bisect_right(qt, t) - 1
            if i >= 0 and q[i][1] >= mbg:
                held += t1 - t
    share = 100 * held / max(wait, 1e-9)
    print(f"trainer waiting {wait:.0f} s, {held:.0f} s of it ({share:.0f}%) with >= one "
          f"minibatch ({mbg} groups) queued; queued groups mean {m['queue']['queued_mean']:.0f}")
    gen = np.array([x for x, _ in handed])
    print(f"group generation (admitted -> finished): p50 {np.median(gen):.0f} s, "
          f"p99 {np.percentile(gen, 99):.0f} s, "
          f"max {gen.max():.0f} s; {(gen > 800).sum()} of {gen.size} over 800 s; longest sample at batch 1 "
          f"{m['limit']['longest_sample_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
