"""Soak: random rollout-instance kills over a long run; what was lost, duplicated, how fast it came back.

One training run (real vLLM instances, megatron-core trainer, Ray; `configs/cpu_tiny.yaml` with small
windows, the asp mode) while a killer thread `ray.kill`s a random rollout instance actor every
`--kill-every` seconds (+-25 % jitter; only while every instance is up). After `--minutes` the run plans
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
    """`ray.kill` a random instance every `every` s (+-25 %), counted from the previous kill, until
    `minutes` have passed; a kill due while a replacement is still rejoining waits until the fleet is
    whole again and then a full interval more."""
    import ray

    rng = random.Random(seed)
    stop_at = time.time() + 60 * minutes
    threading.Thread(target=stopper, args=(ctl, stop_at, done), daemon=True).start()

    def whole() -> bool:
        return not ctl.policy.down and not ctl.fleet.starting and ctl.arrivals_seen > 0

    while not done.is_set() and time.time() < stop_at:
        while not whole():
            if done.wait(0.5):
                return
        if done.wait(every * rng.uniform(0.75, 1.25)) or time.time() >= stop_at:
            return
        if not whole():
            continue
        i = rng.randrange(len(ctl.fleet.instances))
        kills.append({"t": time.time(), "instance": i, "step": ctl.step})
        ray.kill(ctl.fleet.instances[i], no_restart=True)
        with (Path(ctl.run_dir.path).parent / "kills.jsonl").open("a") as f:  # kept if the script dies
            f.write(json.dumps(kills[-1]) + "\n")


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
    """Samples finished per `bucket` s (whole buckets), and the rate while an instance was down (from
    its kill until its replacement rejoined) against the rate while the fleet was whole: the dip."""
    ts = sorted(s["t_finished"] for s in samples if s.get("t_finished"))
    if len(ts) < 2:
        return {}
    t0, t1 = ts[0], ts[-1]
    counts = [0] * max(1, int((t1 - t0) // bucket))
    for t in ts:
        b = int((t - t0) // bucket)
        if b < len(counts):
            counts[b] += 1
    down = [(k["t"], k["t"] + k["detect_s"] + k["recovery_s"]) for k in kills if "recovery_s" in k]
    down_s = sum(min(b, t1) - max(a, t0) for a, b in down if b > t0 and a < t1)
    n_down = sum(any(a <= t < b for a, b in down) for t in ts)
    rate_down = n_down / down_s if down_s > 0 else None
    rate_whole = (len(ts) - n_down) / (t1 - t0 - down_s) if t1 - t0 - down_s > 0 else None
    dip = 1 - rate_down / rate_whole if rate_down is not None and rate_whole else None
    return {"bucket_s": bucket, "per_bucket": counts, "median": statistics.median(counts),
            "min": min(counts), "samples_per_s_whole": rate_whole, "samples_per_s_instance_down": rate_down,
            "down_s": down_s, "dip": dip}


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
        "throughput_samples": throughput(samples, matched, args.bucket),
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
