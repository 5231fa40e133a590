"""`asp-npu report RUN_DIR [--out PNG]`: redraw the one-page report of a run directory."""

from __future__ import annotations

from pathlib import Path

from asp_npu.cli import command_parser
from asp_npu.core import run_dir as rd
from asp_npu.io import check_streamed_jsonl
from asp_npu.observe.metrics import read_metrics
from asp_npu.observe.report import draw_report, validation_lines
from asp_npu.outputs import check_output


def main(argv: list[str]) -> int:
    parser = command_parser("report", "redraw the one-page report (PNG) of a run directory")
    parser.add_argument("run_dir", help="a run directory written by `asp-npu train` or `asp-npu bench real`")
    parser.add_argument("--out", default=None, help="PNG path (default RUN_DIR/report.png)")
    args = parser.parse_args(argv)
    run = rd.RunDir.open(args.run_dir)
    if args.out is not None:  # the run's own files are inputs; only its report.png may be redrawn
        inputs = [(f"run file {name}", run / name) for name in rd.OWNED if name != rd.REPORT]
        check_output(args.out, inputs, own_run=Path(args.run_dir), allowed=(rd.REPORT,))
    check_streamed_jsonl(run / rd.METRICS, "metrics log (metrics.jsonl)")
    path = draw_report(args.run_dir, args.out)
    for line in validation_lines(read_metrics(rd.RunDir.open(args.run_dir) / rd.METRICS)):
        print(f"validation: {line}")
    print(f"report written to {path}")
    return 0
