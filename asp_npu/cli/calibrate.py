"""`asp-npu calibrate --config FILE --out calib.json`: measure engine, trainer and core sharing.

The rollout code measures one engine, then the trainer at the config's minibatch shape and how the
two slow each other down when they share cores (asp_npu/pipeline/calibrate.py,
asp_npu/trainer/calibrate.py); the simulator fits its cost model to the points
(asp_npu/sim/calibrate.py); this command joins them and writes the file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asp_npu.cli import command_parser
from asp_npu.config import load_config
from asp_npu.errors import UserError
from asp_npu.io import atomic_write_json, check_writable
from asp_npu.outputs import check_output
from asp_npu.sim.calibrate import MAX_FOREIGN_LOAD, MAX_SPREAD, decode_corners, step_s


def main(argv: list[str]) -> int:
    parser = command_parser(
        "calibrate", "measure the local vLLM engine, trainer and core sharing for the simulator's cpu preset"
    )
    parser.add_argument("--config", required=True, help="YAML config (model, generate_config)")
    parser.add_argument("--out", required=True, help="calibration JSON to write (asp-calib/1)")
    parser.add_argument("--quick", action="store_true", help="fewer points (CI / smoke test)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="measurements per probe: the median is used, min..max reported with it")
    parser.add_argument("--max-spread", type=float, default=MAX_SPREAD,
                        help="a figure whose repeats differ by more than this share of its median is noise")
    parser.add_argument("--max-foreign-load", type=float, default=MAX_FOREIGN_LOAD,
                        help="other processes' mean CPU use during the probes (share of the cores) above "
                        "which the machine was too busy to trust")
    parser.add_argument(
        "--no-trainer", dest="trainer", action="store_false",
        help="measure the engine only (trainer cost and core sharing stay null)",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides key=value")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        raise UserError("--repeats must be >= 1")
    for flag, v in (("--max-spread", args.max_spread), ("--max-foreign-load", args.max_foreign_load)):
        if not 0 < v < 10:
            raise UserError(f"{flag} must be a positive share, e.g. 0.05 (got {v})")
    check_writable(args.out)
    cfg = load_config(args.config, args.overrides)
    check_output(args.out, [("--config", args.config), ("model.path", cfg.model.path)])
    from asp_npu.pipeline.calibrate import measure_config
    from asp_npu.sim.calibrate import calibration

    measured = measure_config(cfg, quick=args.quick, repeats=args.repeats, trainer=args.trainer)
    result = calibration(measured.model, measured.points, measured.meta, args.max_spread,
                         args.max_foreign_load)
    atomic_write_json(args.out, result, indent=1)
    print_result(args.out, result)
    return 0


Figure = tuple[str, Callable[[dict[str, Any]], Any], str, str]
FIGURES: tuple[Figure, ...] = (  # (label, the calibration's value, its key in `spread`, unit)
    ("decode step, fixed", lambda r: r["decode_step_s"]["a"], "decode_a", "s"),
    ("decode step, per sequence", lambda r: r["decode_step_s"]["b_per_seq"], "decode_b_per_seq", "s"),
    ("decode step, per KV token", lambda r: r["decode_step_s"]["c_per_kv_token"], "decode_c_per_kv_token",
     "s"),
    ("prefill per token", lambda r: r["prefill_s_per_token"], "prefill_s_per_token", "s"),
    ("weight refresh", lambda r: r["refresh_s"], "refresh_s", "s"),
    ("trainer per token (asynchronous)", lambda r: r["trainer_s_per_token"], "trainer_s_per_token",
     "device-s"),
    ("trainer fixed per step (asynchronous)", lambda r: r["trainer_step_s"], "", "s"),
    ("trainer per token (colocated)", lambda r: r["trainer_s_per_token_colocated"],
     "trainer_s_per_token_colocated", "device-s"),
    ("trainer fixed per step (colocated)", lambda r: r["trainer_step_s_colocated"], "", "s"),
    ("core sharing: decode slowdown", lambda r: (r["core_sharing"] or {}).get("decode_slowdown"),
     "decode_slowdown", "x"),
    ("core sharing: trainer slowdown", lambda r: (r["core_sharing"] or {}).get("train_slowdown"),
     "train_slowdown", "x"),
    ("matmul, one device", lambda r: r.get("matmul_flops_per_s"), "matmul_flops_per_s", "FLOP/s"),
    ("host optimizer step per parameter", lambda r: r.get("host_optimizer_s_per_param"),
     "host_optimizer_s_per_param", "s"),
)


def print_result(out: str, result: dict[str, Any]) -> None:
    """Every figure with its spread over the repeats (min..max, relative), then the one trust line."""
    print(f"wrote {out}:")
    for label, value, key, unit in FIGURES:
        v = value(result)
        if v is None:
            continue
        s = result["spread"].get(key) if key else None
        print(f"  {label:<40} {v:>11.4g} {unit:<8}{_range(s) if s else '  (from the medians)'}")
    if result["points"].get("decode"):  # what the verdict judges the decode fit by
        for key, (batch, kv) in decode_corners(result["points"]["decode"]).items():
            s, v = result["spread"].get(key), step_s(result["decode_step_s"], batch, kv)
            label = f"decode step at batch {batch}, {kv:.0f} KV"
            print(f"  {label:<40} {v:>11.4g} {'s':<8}{_range(s) if s else ''}")
    print(result["trust"]["line"])


def _range(s: dict[str, Any]) -> str:
    return f"  min..max {s['min']:.4g}..{s['max']:.4g}, spread {s['rel']:.1%} over {s['n']}"
