"""`asp-npu import-config mindspeed-rl FILE.yaml --out ours.yaml`: translate a MindSpeed-RL GRPO
config into an asp-npu config (how: asp_npu/deploy/import_config.py)."""

from __future__ import annotations

from pathlib import Path

from asp_npu.cli import command_parser
from asp_npu.config import MODES, load_config
from asp_npu.deploy.import_config import render_yaml, translate
from asp_npu.deploy.layout import card_for
from asp_npu.errors import UserError
from asp_npu.io import atomic_write, check_writable


def main(argv: list[str]) -> int:
    p = command_parser("import-config", "translate a MindSpeed-RL GRPO config into an asp-npu config")
    p.add_argument("source", choices=["mindspeed-rl"], help="the config's origin")
    p.add_argument("file", help="MindSpeed-RL YAML (e.g. configs/grpo_qwen25_7b_A3.yaml)")
    p.add_argument("--out", required=True, help="where to write the asp-npu YAML")
    p.add_argument(
        "--card", default=None, help="910b | 910b4 | a2 | a3 (default: from the file name, else 910b)"
    )
    p.add_argument("--mode", default="asp", choices=list(MODES), help="asp-npu mode (default asp)")
    args = p.parse_args(argv)
    from omegaconf import OmegaConf

    src = Path(args.file)
    if not src.is_file():
        raise UserError(f"{src}: file not found")
    try:
        ms = OmegaConf.to_container(OmegaConf.load(src), resolve=False)
    except Exception as exc:
        raise UserError(f"{src}: cannot parse YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(ms, dict):
        raise UserError(f"{src}: expected a MindSpeed-RL config (a YAML mapping), got {type(ms).__name__}")
    if args.card is not None:
        try:
            card_for(args.card)
        except KeyError as exc:
            raise UserError(str(exc.args[0])) from None
    check_writable(args.out)
    tr = translate({str(k): v for k, v in ms.items()}, src, args.card, args.mode)
    text = render_yaml(tr, src)
    atomic_write(args.out, text)
    load_config(args.out, check=False)  # what we wrote must load
    print(f"wrote {args.out}: mapped {len(set(tr.mapped))} key(s), could not map {len(tr.unmapped)}")
    for n in tr.notes:
        print(f"note: {n}")
    for k, why in tr.unmapped:
        print(f"not mapped: {k}: {why}")
    print(f"next: asp-npu check --config {args.out}")
    return 0
