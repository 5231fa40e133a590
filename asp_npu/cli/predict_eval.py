"""`asp-npu predict-eval`: how well a predictor ranks and sizes one epoch, from earlier epochs only."""

from __future__ import annotations

import json

from asp_npu.cli import command_parser
from asp_npu.data.traces import read_trace
from asp_npu.errors import UserError
from asp_npu.predict.evaluate import evaluate
from asp_npu.predict.factory import PREDICTORS


def main(argv: list[str]) -> int:
    p = command_parser("predict-eval", "Evaluate a response-length predictor on one epoch of a trace.")
    p.add_argument("--trace", required=True)
    p.add_argument("--epoch", type=int, required=True)
    p.add_argument("--predictor", default="history", choices=list(PREDICTORS))
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.epoch < 0:
        raise UserError(f"--epoch must be >= 0 (got {args.epoch})")
    trace = read_trace(args.trace)
    res = evaluate(trace, args.epoch, args.predictor)
    print(json.dumps(res) if args.json else " ".join(f"{k}={v}" for k, v in res.items()))
    return 0
