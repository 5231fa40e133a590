"""`asp-npu sft --config FILE [--out DIR]`: supervised warm start on a synthetic task (an HF folder)."""

from __future__ import annotations

import json

from asp_npu.cli import command_parser
from asp_npu.config import load_config
from asp_npu.outputs import check_output_folder
from asp_npu.trainer.sft import prepare_model, warm_start


def main(argv: list[str]) -> int:
    parser = command_parser("sft", "supervised warm-start on a synthetic task (writes an HF folder)")
    parser.add_argument(
        "--config", default=None, help="YAML config (sections model, data, sft, actor_config)"
    )
    parser.add_argument("--out", default=None, help="HF folder to write (default: sft.out)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. sft.steps=200")
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    inputs = [("model.path", cfg.model.path), ("data.data_path", cfg.data.data_path),
              ("--config", args.config)]
    check_output_folder(args.out or cfg.sft.out, inputs, "--out" if args.out else "sft.out",
                        parents=True)  # before minutes of training
    prepare_model(cfg)
    result = warm_start(cfg, out_dir=args.out)
    if args.json:
        print(json.dumps(result, indent=2))
    return 0
