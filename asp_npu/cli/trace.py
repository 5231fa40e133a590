"""`asp-npu trace synth`: write a synthetic reasoning-RL length trace (model: docs/traces.md)."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import numpy as np

from asp_npu.cli import command_parser
from asp_npu.data.traces import SynthParams, Trace, synth_trace, write_trace
from asp_npu.errors import UserError
from asp_npu.outputs import check_output


def _summary(trace: Trace) -> dict[str, Any]:
    r = trace.response_len
    med = float(np.median(r))
    return {
        "rows": len(trace),
        "prompts": int(trace.prompt_names.size),
        "epochs": int(trace.epochs.size),
        "response_median": med,
        "response_mean": round(float(r.mean()), 1),
        "response_p99": float(np.percentile(r, 99)),
        "p99_over_median": round(float(np.percentile(r, 99)) / med, 2),
        "at_cap": round(float(np.mean(r == r.max())), 4),
    }


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "synth":
        raise UserError("expected `asp-npu trace synth ...`")
    d = SynthParams()
    p = command_parser("trace synth", "Generate a long-tailed synthetic GRPO length trace (JSONL).")
    p.add_argument("--out", required=True, help="output JSONL file")
    for f in fields(SynthParams):
        flag = "--" + f.name.replace("_", "-")
        p.add_argument(
            flag,
            type=type(getattr(d, f.name)),
            default=getattr(d, f.name),
            help=f"(default {getattr(d, f.name)})",
        )
    p.add_argument("--json", action="store_true", help="print a summary as JSON")
    args = p.parse_args(argv[1:])
    params = SynthParams(**{f.name: getattr(args, f.name) for f in fields(SynthParams)})
    params.validate()
    check_output(args.out)
    trace = synth_trace(params)
    write_trace(trace, args.out)
    s = _summary(trace)
    print(json.dumps(s) if args.json else " ".join(f"{k}={v}" for k, v in s.items()))
    return 0
