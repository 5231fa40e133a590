"""`asp-npu train --config FILE [key=value ...]`: GRPO with the ASP asynchronous pipeline.

Order matters for bad input: the config is loaded and checked against this machine (preflight)
before anything is built or started, so a bad value costs one line and no half-made run directory.
Then: build the model if configured and missing, warm-start it (SFT) if configured, start the
actors, train, write the run directory and draw the report.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from asp_npu.config import Config, load_config, to_dict
from asp_npu.pipeline import run_dir as rd
from asp_npu.pipeline.preflight import preflight


def config_yaml(cfg: Config) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg)))


def prepare_model(cfg: Config) -> None:
    """Build the tiny/small model when the path is missing and `model.build_if_missing` allows it."""
    path = Path(cfg.model.path)
    if path.exists():
        return
    from asp_npu.data.init_model import build_model_dir

    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    build_model_dir(path, cfg.model.size, seed=cfg.data.seed, arch=cfg.model.architecture)
    print(f"built model {path} ({cfg.model.size}) in {time.time() - t0:.1f}s", file=sys.stderr)


def warm_start(cfg: Config, run: rd.RunDir) -> None:
    """Supervised warm start (`model.warm_start_steps` > 0): RL then starts from non-zero reward.

    The warm-started policy is written next to the run (`<run_dir>/warm_start`) and used as
    `model.path` from here on, so instances and trainer start from the same weights.
    """
    if cfg.model.warm_start_steps <= 0 or cfg.actor_config.load:
        return  # a resumed run takes its weights from the checkpoint
    from asp_npu.trainer import sft

    out = run.path / rd.WARM_START
    t0 = time.time()
    result = sft.warm_start(cfg, out_dir=str(out), steps=cfg.model.warm_start_steps)
    last = result["evals"][-1] if result.get("evals") else {}
    print(f"warm start: {cfg.model.warm_start_steps} SFT steps in {time.time() - t0:.1f}s -> {out} "
          f"(greedy reward {last.get('reward', float('nan')):.3f})", file=sys.stderr)
    cfg.model.path = str(out)


def train(cfg: Config, kind: str, console: bool = True, label: str = "") -> dict[str, Any]:
    """One training run into `trainer.run_dir` (config already preflighted); returns the run summary."""
    from asp_npu.data.datasets import config_prompts
    from asp_npu.observe.report import draw_report
    from asp_npu.pipeline.controller import Controller

    prepare_model(cfg)
    # resuming into the same run directory must not clear the checkpoint it resumes from
    run = rd.RunDir.create(cfg.trainer.run_dir, config_yaml(cfg),
                           keep_checkpoints=bool(cfg.actor_config.load))
    warm_start(cfg, run)
    prompts = config_prompts(cfg.data)
    ctl = Controller(cfg, run, prompts, kind=kind, console=console, label=label)
    try:
        ctl.start()
        summary = ctl.run()
    finally:
        ctl.close()
    draw_report(run.path)
    return summary


def main(argv: list[str]) -> int:
    from asp_npu.cli import command_parser

    parser = command_parser("train", "GRPO training with the ASP asynchronous pipeline")
    parser.add_argument("--config", default=None, help="YAML config (e.g. configs/cpu_tiny.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. rl_config.max_lag=2")
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.overrides, check=False)
    kind = preflight(cfg)
    summary = train(cfg, kind)
    run = Path(cfg.trainer.run_dir)
    print(
        f"done: {summary['steps']} steps, {summary['throughput_tokens_per_s']:.0f} tokens/s, "
        f"final reward {summary['final_reward']:.3f}, "
        f"lag max {summary['lag_max']} (bound {summary['max_lag']})"
    )
    print(f"report: {run / rd.REPORT}")
    print(f"run directory: {run} (metrics.jsonl, tensorboard/, timeline.json, checkpoints/)")
    return 0
