"""`asp-npu config-reference [--out FILE]`: the configuration reference, generated from the dataclasses."""

from __future__ import annotations

from asp_npu.cli import command_parser
from asp_npu.deploy.reference import render
from asp_npu.io import atomic_write, check_writable


def main(argv: list[str]) -> int:
    parser = command_parser("config-reference", "every config key: type, default, range, MindSpeed-RL name")
    parser.add_argument("--out", default=None, help="write it here (docs/configuration.md); default: print")
    args = parser.parse_args(argv)
    text = render()
    if args.out is None:
        print(text, end="")
        return 0
    check_writable(args.out)
    atomic_write(args.out, text)
    print(f"configuration reference written to {args.out}")
    return 0
