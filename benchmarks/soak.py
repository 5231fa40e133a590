"""Soak: random rollout-instance kills over a long run; what was lost, duplicated, how fast it came back.

One training run (real vLLM instances, megatron-core trainer, Ray; `configs/cpu_tiny.yaml` with small
windows, the asp mode) while a killer thread `ray.kill`s a random live rollout instance actor every
`--kill-every` seconds (+-25 % jitter, once the fleet is whole again). After `--minutes` the run plans
no further window (its shape is cut to the windows planned so far), trains what is planned and ends.
Afterwards, from what the run recorded:

- kills survived: kills made, instances lost and recovered (`run_log.jsonl`), whether the run finished;
- prompts lost / duplicated: every planned (prompt, sample) of `plans/` against `samples.jsonl`;
- throughput per time window (samples finished per `--bucket` seconds, from `samples.jsonl`
  t_finished): median, the lowest window (the dip) and windows with a kill against windows without;
- recovery times: kill -> detected and detected -> rejoined, per kill.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/soak.py --minutes 20 --kill-every 60 \
        --out /tmp/soak [--json soak.json]

A timing script, not a test: figures depend on the machine's load (print `uptime` alongside).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from asp_npu.device import loopback_env

# small windows (6 prompts x 4 samples, minibatches of 8), as the CI e2e and chaos tests
OVERRIDES = [
    "data.num_prompts=12", "rl_config.n_samples_per_prompt=4", "rl_config.mini_batch_size=8",
    "rl_config.global_batch_size=6", "rl_config.max_lag=1", "generate_config.max_num_seqs=8",
    "generate_config.sampling_config.max_tokens=24", "actor_config.micro_batch_size=8",
    "trainer.device=cpu", "trainer.stall_timeout_s=300", "model.warm_start_steps=0",
    "trainer.logger=[jsonl]", "trainer.save_freq=0",
    "generate_config.weight_transfer=object-store",  # a replaced instance reloads through the object store
]


def killer(ctl: Any, every: float, minutes: float, seed: int, done: threading.Event,
           kills: list[dict[str, Any]]) -> None:
    """Every `every` s (+-25 %) once the fleet is whole again, `ray.kill` a random instance."""
    import ray

    rng = random.Random(seed)
    stop_at = time.time() + 60 * minutes
    threading.Thread(target=stopper, args=(ctl, stop_at, done), daemon=True).start()
    while not done.is_set() and time.time() < stop_at:
        if done.wait(every * rng.uniform(0.75, 1.25)):
            return
        while not done.is_set() and (ctl.policy.down or ctl.fleet.starting or ctl.arrivals_seen == 0):
            done.wait(0.5)  # the previous kill's replacement is still rejoining
        if done.is_set() or time.time() >= stop_at:
            return
        i = rng.randrange(len(ctl.fleet.instances))
        kills.append({"t": time.time(), "instance": i, "step": ctl.step})
        ray.kill(ctl.fleet.instances[i], no_restart=True)


def stopper(ctl: Any, stop_at: float, done: threading.Event) -> None:
    """At `stop_at`, cut the run to the windows planned so far (+1: one may be in planning right now)."""
    if done.wait(max(0.0, stop_at - time.time())):
        return
    ctl.shape = dataclasses.replace(ctl.shape, iterations=ctl.next_window + 1)


def planned(run: Path) -> list[tuple[str, int]]:
    out = []
    for plan in sorted((run / "plans").glob("*.json")):
        for inst in json.loads(plan.read_text())["instances"]:
            for unit in inst["units"]:
                out += [(s["prompt_id"], s["sample_idx"]) for s in unit["samples"]]
    return out


def match_kills(kills: list[dict[str, Any]], log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each kill with its instance_lost (the first after it, same instance) and instance_recovered."""
    lost = [r for r in log if r["event"] == "instance_lost"]
    back = [r for r in log if r["event"] == "instance_recovered"]
    out = []
    for k in kills:
        row: dict[str, Any] = dict(k)
        lo = next((r for r in lost if r["instance"] == k["instance"] and r["t"] >= k["t"]), None)
        if lo is not None:
            lost.remove(lo)
            row["detect_s"] = lo["t"] - k["t"]
            row["groups_redispatched"] = lo.get("groups_redispatched", 0)
            bk = next((r for r in back if r["instance"] == k["instance"] and r["t"] >= lo["t"]), None)
            if bk is not None:
                back.remove(bk)
                row["recovery_s"] = bk["recovery_s"]
        out.append(row)
    return out


def throughput(samples: list[dict[str, Any]], kills: list[dict[str, Any]], bucket: float
               ) -> dict[str, Any]:
    """Samples finished per `bucket` s; windows that saw a kill (or the following one) against the rest."""
    ts = sorted(s["t_finished"] for s in samples if s.get("t_finished"))
    if len(ts) < 2:
        return {}
    t0, n = ts[0], int((ts[-1] - ts[0]) // bucket)  # whole buckets only
    counts = [0] * max(1, n)
    for t in ts:
        b = int((t - t0) // bucket)
        if b < len(counts):
            counts[b] += 1
    hit = {int((k["t"] - t0) // bucket) + d for k in kills for d in (0, 1)}
    with_kill = [c for b, c in enumerate(counts) if b in hit]
    without = [c for b, c in enumerate(counts) if b not in hit]
    med = statistics.median(counts)
    return {"bucket_s": bucket, "per_bucket": counts, "median": med, "min": min(counts),
            "dip": 1 - min(counts) / med if med else 0.0,
            "median_kill_windows": statistics.median(with_kill) if with_kill else None,
            "median_quiet_windows": statistics.median(without) if without else None}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from asp_npu.config import load_config
    from asp_npu.core import run_dir as rd
    from asp_npu.data.datasets import config_prompts
    from asp_npu.data.init_model import build_model_dir
    from asp_npu.pipeline.controller import Controller
    from asp_npu.pipeline.train import config_yaml

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model = build_model_dir(out / "tiny", "tiny", seed=0)
    cfg = load_config("configs/cpu_tiny.yaml", [
        f"model.path={model}", *OVERRIDES, f"trainer.train_iters={args.iters}",
        f"generate_config.num_instances={args.instances}", f"trainer.run_dir={out / 'run'}",
        *args.overrides])
    run_dir = rd.RunDir.create(cfg.trainer.run_dir, config_yaml(cfg))
    ctl = Controller(cfg, run_dir, config_prompts(cfg.data), kind="cpu", console=True)
    kills: list[dict[str, Any]] = []
    done = threading.Event()
    t_start = time.time()
    summary: dict[str, Any] = {}
    error = ""
    try:
        ctl.start()
        t_start = time.time()
        thread = threading.Thread(target=killer, daemon=True,
                                  args=(ctl, args.kill_every, args.minutes, args.seed, done, kills))
        thread.start()
        summary = ctl.run()
    except Exception as exc:  # noqa: BLE001 - a soak reports how the run ended, whatever it was
        error = f"{type(exc).__name__}: {exc}"
    finally:
        done.set()
        ctl.close()
    wall = time.time() - t_start
    samples = [json.loads(line) for line in (run_dir.path / rd.SAMPLES).read_text().splitlines()]
    log_path = run_dir.path / "run_log.jsonl"
    log = [json.loads(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []
    consumed = [(f"{s['prompt_id']}@{s['epoch']}", s["sample_idx"]) for s in samples]
    plan = planned(run_dir.path)
    matched = match_kills(kills, log)
    rec = [k["recovery_s"] for k in matched if "recovery_s" in k]
    det = [k["detect_s"] for k in matched if "detect_s" in k]
    lag_ok = all(0 <= s["step"] - s["policy_version"] <= summary.get("max_lag", 1) for s in samples)
    return {
        "finished": not error, "error": error, "wall_s": wall, "iters": args.iters,
        "kill_every_s": args.kill_every, "kill_minutes": args.minutes, "instances": args.instances,
        "kills": len(kills), "instances_lost": sum(r["event"] == "instance_lost" for r in log),
        "recovered": len(rec), "planned_samples": len(plan), "consumed_samples": len(consumed),
        "lost_samples": len(set(plan) - set(consumed)) if not error else None,
        "duplicated_samples": len(consumed) - len(set(consumed)),
        "unplanned_samples": len(set(consumed) - set(plan)), "lag_bound_held": lag_ok,
        "detect_s": {"median": statistics.median(det), "max": max(det)} if det else None,
        "recovery_s": {"median": statistics.median(rec), "max": max(rec), "all": rec} if rec else None,
        "throughput_samples": throughput(samples, kills, args.bucket),
        "kill_log": matched, "steps": summary.get("steps"), "run_dir": str(run_dir.path),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=20.0, help="how long the run plans windows and kills")
    ap.add_argument("--iters", type=int, default=100000, help="at most this many windows (24 samples each)")
    ap.add_argument("--kill-every", type=float, default=60.0, help="seconds between kills (+-25 %%)")
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--bucket", type=float, default=60.0, help="throughput window, seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="/tmp/asp_soak")
    ap.add_argument("--json", default="")
    ap.add_argument("overrides", nargs="*", help="extra config overrides key=value")
    args = ap.parse_args()
    for k, v in loopback_env().items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    res = run(args)
    text = json.dumps(res, indent=1)
    if args.json:
        Path(args.json).write_text(text)
    short = {k: v for k, v in res.items() if k not in ("kill_log",)}
    print(json.dumps(short, indent=1))


if __name__ == "__main__":
    main()
