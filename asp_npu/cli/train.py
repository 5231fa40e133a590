"""`asp-npu train --config FILE [key=value ...]`: GRPO with the ASP asynchronous pipeline.

The config is loaded and checked against this machine (preflight) before anything is built or
started, so a bad value costs one line and no half-made run directory (asp_npu/pipeline/train.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from asp_npu.cli import command_parser
from asp_npu.config import load_config
from asp_npu.core import run_dir as rd
from asp_npu.deploy.search import resolve_layout
from asp_npu.pipeline.preflight import preflight
from asp_npu.pipeline.resume import Stopped, TrainerFailed
from asp_npu.pipeline.train import train


def main(argv: list[str]) -> int:
    parser = command_parser("train", "GRPO training with the ASP asynchronous pipeline")
    parser.add_argument("--config", default=None, help="YAML config (e.g. configs/cpu_tiny.yaml)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a previous run's checkpoints in trainer.run_dir (default: refuse)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. rl_config.max_lag=2")
    args = parser.parse_args(argv)
    cfg = resolve_layout(load_config(args.config, args.overrides, check=False))  # rl_config.layout: auto
    kind = preflight(cfg)
    try:
        summary = train(cfg, kind, overwrite=args.overwrite)
    except Stopped as stop:  # SIGTERM/SIGINT: checkpointed, one line on how to resume
        print(f"asp-npu: {stop}", file=sys.stderr, flush=True)
        return stop.exit_code
    except TrainerFailed as exc:  # every actor and Ray are down; the last checkpoint is named
        print(f"asp-npu: {exc}", file=sys.stderr, flush=True)
        return 1
    run = Path(cfg.trainer.run_dir)
    print(
        f"done: {summary['steps']} steps, {summary['throughput_tokens_per_s']:.0f} tokens/s, "
        f"final reward {summary['final_reward']:.3f}, "
        f"lag max {summary['lag_max']} (bound {summary['max_lag']})"
    )
    from asp_npu.pipeline.efficiency import describe

    print(f"run: {describe(summary.get('against_limit'))}")
    print(f"report: {run / rd.REPORT}")
    print(f"run directory: {run} (metrics.jsonl, tensorboard/, timeline.json, checkpoints/)")
    return 0
