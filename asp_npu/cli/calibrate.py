"""`asp-npu calibrate --config FILE --out calib.json`: measure engine, trainer and core sharing.

The rollout code measures one engine, then the trainer at the config's minibatch shape and how the
two slow each other down when they share cores (asp_npu/pipeline/calibrate.py,
asp_npu/trainer/calibrate.py); the simulator fits its cost model to the points
(asp_npu/sim/calibrate.py); this command joins them and writes the file.
"""

from __future__ import annotations

from asp_npu.cli import command_parser
from asp_npu.config import load_config
from asp_npu.errors import UserError
from asp_npu.io import atomic_write_json, check_writable
from asp_npu.outputs import check_output


def main(argv: list[str]) -> int:
    parser = command_parser(
        "calibrate", "measure the local vLLM engine, trainer and core sharing for the simulator's cpu preset"
    )
    parser.add_argument("--config", required=True, help="YAML config (model, generate_config)")
    parser.add_argument("--out", required=True, help="calibration JSON to write (asp-calib/1)")
    parser.add_argument("--quick", action="store_true", help="fewer points (CI / smoke test)")
    parser.add_argument("--repeats", type=int, default=2, help="measurements per point (median)")
    parser.add_argument(
        "--no-trainer", dest="trainer", action="store_false",
        help="measure the engine only (trainer cost and core sharing stay null)",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides key=value")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        raise UserError("--repeats must be >= 1")
    check_writable(args.out)
    cfg = load_config(args.config, args.overrides)
    check_output(args.out, [("--config", args.config), ("model.path", cfg.model.path)])
    from asp_npu.pipeline.calibrate import measure_config
    from asp_npu.sim.calibrate import calibration

    measured = measure_config(cfg, quick=args.quick, repeats=args.repeats, trainer=args.trainer)
    result = calibration(measured.model, measured.points, measured.meta)
    atomic_write_json(args.out, result, indent=1)
    s = result["decode_step_s"]
    print(
        f"wrote {args.out}: decode step = {s['a'] * 1e3:.3f} ms + {s['b_per_seq'] * 1e3:.4f} ms/seq "
        f"+ {s['c_per_kv_token'] * 1e6:.4f} us/KV token; "
        f"prefill {result['prefill_s_per_token'] or 0:.2e} s/token; refresh {result['refresh_s'] or 0:.3f} s"
    )
    if result["trainer_s_per_token"] is not None:
        sh = result["core_sharing"]
        print(
            f"trainer {result['trainer_step_s']:.3f} s/step + {result['trainer_s_per_token']:.3e} "
            f"device-s/token (asynchronous placement), {result['trainer_step_s_colocated']:.3f} s + "
            f"{result['trainer_s_per_token_colocated']:.3e} (colocated); core sharing: decode "
            f"x{sh['decode_slowdown']:.2f}, trainer x{sh['train_slowdown']:.2f} while the other side is busy"
        )
    return 0
