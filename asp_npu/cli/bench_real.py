"""`asp-npu bench real`: run modes one after the other with real engines and trainer, side by side
(how: asp_npu/pipeline/bench.py)."""

from __future__ import annotations

from pathlib import Path

from asp_npu.cli import command_parser
from asp_npu.config import load_config
from asp_npu.errors import UserError
from asp_npu.outputs import check_output
from asp_npu.pipeline.bench import aggregate, partial_allowed, partial_table, run_bench, table, with_partial
from asp_npu.pipeline.modes import REAL_MODES


def main(argv: list[str]) -> int:
    parser = command_parser("bench real", "run modes side by side with real engines and trainer")
    parser.add_argument("--config", default=None, help="YAML config (e.g. configs/cpu_tiny.yaml)")
    parser.add_argument("--modes", default="asp,async-fifo,mindspeed-sync",
                        help=f"comma-separated, from {','.join(REAL_MODES)}")
    parser.add_argument("--iterations", type=int, default=None, help="trainer.train_iters for every mode")
    parser.add_argument("--seeds", default=None,
                        help="comma-separated data/sampling seeds (default: data.seed)")
    parser.add_argument("--out-dir", default="runs/bench_real", help="one run directory per mode and seed")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace previous runs' checkpoints under --out-dir (default: refuse)")
    parser.add_argument("--json", default=None, help="write the per-mode results here")
    parser.add_argument("--partial-rollout", action="store_true",
                        help="run each selected asynchronous disaggregated mode with partial rollout off and "
                        "on "
                        "(the runs with it on are named <mode>+partial)")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for every mode")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in REAL_MODES]
    if bad or not modes:
        raise UserError(f"--modes: '{(bad or [''])[0]}' is not one of {', '.join(REAL_MODES)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    except ValueError:
        raise UserError(f"--seeds: '{args.seeds}' is not a comma-separated list of integers") from None
    if seeds is not None and len(set(seeds)) != len(seeds):
        dup = next(s for s in seeds if seeds.count(s) > 1)
        raise UserError(f"--seeds: seed {dup} is given twice (each seed is one run directory per mode)")
    if args.partial_rollout and not any(partial_allowed(m) for m in modes):
        raise UserError("--partial-rollout: none of the selected modes is asynchronous and disaggregated")
    if args.iterations is not None and args.iterations < 1:
        raise UserError(f"--iterations: must be >= 1 (got {args.iterations})")
    overrides = list(args.overrides)
    if args.iterations is not None:
        overrides.append(f"trainer.train_iters={args.iterations}")
    base = load_config(args.config, overrides, check=False)
    seeds = seeds or [base.data.seed]
    if args.json:
        check_output(args.json, [("--config", args.config), ("model.path", base.model.path),
                                 ("--out-dir", args.out_dir)], "--json")
    names = with_partial(modes) if args.partial_rollout else modes
    runs = run_bench(base, names, seeds, Path(args.out_dir), args.json, args.config, overrides,
                     overwrite=args.overwrite)
    print(table(aggregate(runs)))
    if args.partial_rollout:
        print()
        print(partial_table(aggregate(runs)))
    if args.json:
        print(f"results written to {args.json}")
    return 0
