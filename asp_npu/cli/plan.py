"""`asp-npu plan`: plan every sample of one epoch of a trace, predicting from earlier epochs only."""

from __future__ import annotations

import json
import time

from asp_npu.cli import command_parser
from asp_npu.data.traces import group_table, read_trace
from asp_npu.errors import UserError
from asp_npu.outputs import check_output
from asp_npu.predict.factory import PREDICTORS
from asp_npu.predict.groups import groups_for_epoch
from asp_npu.schedule.baselines import fifo_plan, random_plan
from asp_npu.schedule.cost import CostModel
from asp_npu.schedule.planner import PlannerConfig, check_plan_flags, plan

DISPATCH = {"asp": plan, "fifo": fifo_plan, "random": random_plan}


def main(argv: list[str]) -> int:
    t_start = time.perf_counter()
    p = command_parser("plan", "Plan one epoch of a length trace with the offline ASP planner.")
    p.add_argument("--trace", required=True, help="JSONL trace (asp-npu trace synth)")
    p.add_argument("--epoch", type=int, required=True, help="epoch to plan; predictions use earlier epochs")
    p.add_argument("--instances", type=int, required=True, help="rollout instances K")
    p.add_argument("--minibatch", type=int, required=True, help="samples per trainer step (whole groups)")
    p.add_argument("--predictor", default="history", choices=list(PREDICTORS))
    p.add_argument("--dispatch", default="asp", choices=list(DISPATCH), help="asp, or a baseline")
    p.add_argument("--max-lag", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=256, help="sequence slots per instance")
    p.add_argument("--train-step-s", type=float, default=0.0, help="trainer seconds per minibatch")
    p.add_argument("--cost-a", type=float, default=CostModel.a, help="seconds per decode step")
    p.add_argument("--cost-b", type=float, default=CostModel.b, help="seconds per sequence per step")
    p.add_argument("--cost-c", type=float, default=CostModel.c, help="seconds per KV token per step")
    p.add_argument("--split-units", action="store_true",
                   help="cut units smaller wherever that evens the instances' predicted tokens (for "
                        "executors that stream an instance's units through continuous batching)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the plan (asp-plan/1 JSON) here")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = p.parse_args(argv)
    cost = check_plan_flags(args.epoch, args.instances, args.minibatch, args.max_num_seqs, args.max_lag,
                            args.train_step_s, (args.cost_a, args.cost_b, args.cost_c), args.seed)
    if args.out is not None:
        check_output(args.out, [("--trace", args.trace)])  # before any work: never plan, then fail to write
    trace = read_trace(args.trace)
    epoch_rows = trace.epoch_rows(args.epoch)
    _, _, n = group_table(epoch_rows)
    if args.minibatch % n:
        raise UserError(f"--minibatch {args.minibatch} is not a multiple of the group size {n}")
    if args.minibatch > len(epoch_rows):
        raise UserError(f"--minibatch {args.minibatch} is larger than epoch {args.epoch} of {args.trace} "
                        f"({len(epoch_rows)} samples): no trainer step could ever fill")
    groups = groups_for_epoch(trace, args.epoch, args.predictor)
    cfg = PlannerConfig(
        num_instances=args.instances,
        minibatch=args.minibatch,
        group_size=n,
        max_num_seqs=args.max_num_seqs,
        max_lag=args.max_lag,
        train_step_s=args.train_step_s,
        split_units=args.split_units,
        cost=cost,
        seed=args.seed,
    )
    result = DISPATCH[args.dispatch](groups, cfg)
    result.summary.update(predictor=args.predictor, epoch=args.epoch, trace=str(args.trace))
    if args.out is not None:
        result.write_json(args.out)
    result.summary["command_seconds"] = round(time.perf_counter() - t_start, 3)
    s = result.summary
    print(json.dumps(s) if args.json else " ".join(f"{k}={v}" for k, v in s.items()))
    return 0

