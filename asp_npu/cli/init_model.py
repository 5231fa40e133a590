"""`asp-npu init-model --out DIR [--arch qwen2|qwen3|qwen3-moe|llama]`: local tokenizer + random model."""

from __future__ import annotations

from asp_npu.cli import command_parser
from asp_npu.data.init_model import ARCH_NAMES, SIZES, build_model_dir, count_params
from asp_npu.errors import UserError
from asp_npu.outputs import check_output_folder


def main(argv: list[str]) -> int:
    parser = command_parser("init-model", "build a local tokenizer + random model (no download)")
    parser.add_argument("--out", required=True, help="folder to create (HF layout)")
    parser.add_argument("--size", default="tiny", choices=sorted(SIZES))
    parser.add_argument("--arch", default="qwen2", help=f"model family: {' | '.join(ARCH_NAMES)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="replace an existing folder")
    args = parser.parse_args(argv)
    check_output_folder(args.out)  # before the model is built (about 12 s for `small`)
    try:
        out = build_model_dir(args.out, args.size, args.seed, args.force, arch=args.arch)
    except OSError as exc:
        raise UserError(f"{args.out}: cannot write the model ({exc.strerror or exc})") from None
    n_params = count_params(out)
    print(f"wrote {out} ({args.arch} {args.size}, {n_params / 1e6:.2f}M parameters)")
    return 0
