"""SFT warm-start: greedy exact-match reward on the RL prompts before and during supervised training.

Usage: .venv/bin/python benchmarks/sft_reward.py [--size tiny] [--steps 1000] [--eval-every 250]
       [--task count] [--config configs/cpu_tiny.yaml] [key=value ...] [--json]

Builds a fresh random model (`asp-npu init-model`, no download) in a temp folder, runs
`asp_npu.trainer.sft.warm_start` (megatron-core trainer as a Ray actor group, layout from the config)
and scores the first `sft.eval_prompts` RL prompts (the config's `data` section: same task, seed and
length distribution that `asp-npu train` uses) with greedy HF decoding. "exact_match" = share of
prompts answered exactly; "reward" = the RL reward (partial credit). Training time excludes evals.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asp_npu.device import loopback_env  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/cpu_tiny.yaml")
    ap.add_argument("--size", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--task", default="")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("overrides", nargs="*", help="extra key=value config overrides")
    args = ap.parse_args()
    for k, v in {
        **loopback_env(),
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
    }.items():
        os.environ.setdefault(k, v)
    from asp_npu.config import load_config
    from asp_npu.data.init_model import build_model_dir
    from asp_npu.trainer.sft import warm_start

    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"model.path={tmp}/model",
            f"model.size={args.size}",
            f"sft.eval_every={args.eval_every}",
        ]
        overrides += [f"data.task={args.task}"] if args.task else []
        cfg = load_config(args.config, overrides + list(args.overrides))
        build_model_dir(cfg.model.path, cfg.model.size, seed=cfg.data.seed)
        quiet = (lambda msg: None) if args.json else None
        result = warm_start(cfg, out_dir=f"{tmp}/sft", steps=args.steps, log=quiet)
    result.pop("out")
    result["losses"] = [round(x, 4) for x in result["losses"][:: max(1, len(result["losses"]) // 20)]]
    result.update(
        {
            "task": cfg.data.task,
            "size": args.size,
            "batch_size": cfg.sft.batch_size,
            "lr": cfg.sft.lr,
            "eval_prompts": cfg.sft.eval_prompts,
            "max_items": cfg.sft.max_items,
        }
    )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"task={cfg.data.task} size={args.size} steps={args.steps} train_time={result['seconds']:.0f}s")
        print(f"{'step':>6} {'exact_match':>12} {'reward':>8} {'resp_len':>9}")
        for e in result["evals"]:
            print(f"{e['step']:>6} {e['exact_match']:>12.3f} {e['reward']:>8.3f} {e['response_len']:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
