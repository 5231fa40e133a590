"""`asp-npu import-config mindspeed-rl|verl FILE.yaml --out ours.yaml`: translate a MindSpeed-RL or verl
GRPO config into an asp-npu config (how: asp_npu/deploy/import_config.py, import_verl.py)."""

from __future__ import annotations

from typing import Any

from asp_npu.cli import command_parser
from asp_npu.config import MODES, load_config
from asp_npu.deploy.import_config import render_yaml, translate
from asp_npu.deploy.layout import card_for
from asp_npu.errors import UserError
from asp_npu.io import atomic_write, check_yaml_file, yaml_problem
from asp_npu.outputs import check_output

OUR_SECTIONS = ("trainer", "sft", "data", "model")  # sections MindSpeed-RL's GRPO configs do not have
OUR_RL_KEYS = ("mode", "max_lag", "predictor")  # rl_config keys only asp-npu has


def _ours(ms: dict[Any, Any]) -> str:
    """Why a parsed YAML is one of our own configs ("" when it is not)."""
    if "megatron_training" in ms:
        return ""
    sections = [s for s in OUR_SECTIONS if isinstance(ms.get(s), dict)]
    rl = ms.get("rl_config")
    keys = [k for k in OUR_RL_KEYS if isinstance(rl, dict) and k in rl]
    if len(sections) >= 2 or (sections and keys):
        return f"sections {', '.join(sections)}" + (f", rl_config.{keys[0]}" if keys else "")
    return ""


def main(argv: list[str]) -> int:
    p = command_parser("import-config", "translate a MindSpeed-RL or verl GRPO config into an asp-npu config")
    p.add_argument("source", choices=["mindspeed-rl", "verl"], help="the config's origin")
    p.add_argument("file", help="MindSpeed-RL YAML (e.g. configs/grpo_qwen25_7b_A3.yaml), or verl YAML: its "
                   "ppo_trainer.yaml shape or an example's overrides (nested or dotted keys)")
    p.add_argument("--out", required=True, help="where to write the asp-npu YAML")
    p.add_argument(
        "--card", default=None, help="910b | 910b4 | a2 | a3 (default: from the file name, else 910b)"
    )
    p.add_argument("--mode", default="asp", choices=list(MODES), help="asp-npu mode (default asp)")
    args = p.parse_args(argv)
    import yaml
    from omegaconf import OmegaConf

    src = check_yaml_file(args.file, "MindSpeed-RL YAML")
    try:
        ms = OmegaConf.to_container(OmegaConf.load(src), resolve=False)
    except yaml.YAMLError as exc:
        raise UserError(yaml_problem(src, exc)) from None
    except Exception as exc:  # noqa: BLE001 - OmegaConf's refusals of odd YAML
        raise UserError(f"{src}: cannot parse YAML: {str(exc).splitlines()[0]}") from None
    if args.source == "verl":
        return _verl(ms, src, args)
    if not isinstance(ms, dict):
        raise UserError(f"{src}: expected a MindSpeed-RL config (a YAML mapping), got {type(ms).__name__}")
    ours = _ours(ms)
    if ours:
        raise UserError(f"{src}: is an asp-npu config ({ours}), not a MindSpeed-RL one: use it as it is "
                        f"(asp-npu check --config {src})")
    if args.card is not None:
        try:
            card_for(args.card)
        except KeyError as exc:
            raise UserError(str(exc.args[0])) from None
    check_output(args.out, [("file", src), ("model folder", src.parent / "model")])
    tr = translate({str(k): v for k, v in ms.items()}, src, args.card, args.mode)
    _write(render_yaml(tr, src), tr, args.out)
    return 0


def _verl(raw: Any, src: Any, args: Any) -> int:
    """`import-config verl`: asp_npu/deploy/import_verl.py."""
    from asp_npu.deploy.import_verl import render_verl_yaml, translate_verl

    if args.card is not None:
        try:
            card_for(args.card)
        except KeyError as exc:
            raise UserError(str(exc.args[0])) from None
    check_output(args.out, [("file", src)])
    tr = translate_verl(raw, src, args.card, args.mode)
    _write(render_verl_yaml(tr, src), tr, args.out)
    return 0


def _write(text: str, tr: Any, out: str) -> None:
    """Write the translation, check that it loads, print the ledger."""
    atomic_write(out, text)
    load_config(out, check=False)  # what we wrote must load
    print(f"wrote {out}: mapped {len(set(tr.mapped))} key(s), could not map {len(tr.unmapped)}")
    for n in tr.notes:
        print(f"note: {n}")
    for k, why in tr.unmapped:
        print(f"not mapped: {k}: {why}")
    print(f"next: asp-npu check --config {out}")
