"""`asp-npu export-hf RUN_DIR/checkpoints [--step N] --out DIR`: a trainer checkpoint as an HF folder.

The policy weights of the checkpoint (`latest.json`'s iteration, or `--step N`) become sharded
safetensors in the model's dtype with `model.safetensors.index.json`, next to the config, tokenizer and
generation config of the model folder the run started from; transformers and vLLM load the folder.
"""

from __future__ import annotations

import json

from asp_npu.cli import command_parser
from asp_npu.errors import UserError


def _size(text: str) -> int:
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
    t = text.strip().upper()
    for u, mult in units.items():
        if t.endswith(u) and t[:-2].strip().isdigit():
            return int(t[:-2]) * mult
    if t.isdigit():
        return int(t)
    raise UserError(f"--max-shard-size: '{text}' is not a size like 2GB, 500MB or a byte count")


def main(argv: list[str]) -> int:
    parser = command_parser("export-hf", "write a trainer checkpoint as a Hugging Face model folder")
    parser.add_argument("checkpoints", help="RUN_DIR/checkpoints (or one of its iter_* folders)")
    parser.add_argument("--out", required=True, help="HF folder to write (new, empty, or an earlier export)")
    parser.add_argument("--step", type=int, default=None, help="trainer step to export (default: latest)")
    parser.add_argument("--model", default=None,
                        help="HF folder with config + tokenizer (default: the one the run started from)")
    parser.add_argument("--max-shard-size", default="2GB", help="largest safetensors file (default 2GB)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    args = parser.parse_args(argv)
    if args.step is not None and args.step < 0:
        raise UserError(f"--step: must be >= 0 (got {args.step})")
    from asp_npu.trainer.hf_export import export_checkpoint

    result = export_checkpoint(args.checkpoints, args.out, args.step, args.model, _size(args.max_shard_size))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"wrote {result['out']}: step {result['step']} (policy version {result['policy_version']}), "
              f"{result['tensors']} tensors, {result['bytes'] / 2**20:.1f} MiB {result['dtype']}")
    return 0
