"""`asp-npu check --config FILE [--nodes N --npus-per-node M]`: validate a config for a cluster
before queueing for it, without touching hardware (what is checked: asp_npu/deploy/check.py).

A bad config lists every problem on stderr and exits 2. `--calib FILE` charges the host optimizer step
`asp-npu calibrate` measured (`trainer.host_optimizer_s_per_param`) instead of the documented figure.
`--suggest` prints the layout search's best
asynchronous splits of the same cluster (asp_npu/deploy/search.py); a config with `rl_config.layout: auto`
is checked on the search's choice.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from asp_npu.cli import command_parser
from asp_npu.config import Config, load_config
from asp_npu.deploy.check import check, format_layout, sim_estimate
from asp_npu.deploy.layout import card_for
from asp_npu.errors import UserError

MAX_NODES = 100_000  # the check is linear in the node count: about 10 s and 1 GiB at this size
MAX_NPUS_PER_NODE = 64  # known cards have 8 or 16


def _layout(cfg: Config, nodes: int, per_node: int, card_name: str, suggest: bool, out: TextIO) -> Config:
    """`layout: auto`: the search's choice (printed); `--suggest`: the search printed, the config as given."""
    from asp_npu.deploy.search import apply_layout_auto, format_result, search

    card = card_for(card_name)
    if cfg.rl_config.layout == "auto":
        cfg, lines = apply_layout_auto(cfg, nodes, per_node, card)
        lines.append("rl_config.layout: auto -> the best split above is checked below\n")
        print("\n".join(lines), file=out)
    elif suggest:
        print("\n".join(format_result(search(cfg, nodes, per_node, card)) + [""]), file=out)
    return cfg


def _cluster(args: Any, cfg: Any) -> tuple[str, int, int]:
    """(card, nodes, NPUs per node) from the flags, else the config, else the card's; bounded."""
    card_name = args.card if args.card is not None else cfg.trainer.card
    try:
        per_node_default = card_for(card_name).npus_per_node
    except KeyError as exc:
        raise UserError(str(exc.args[0])) from None
    nodes = args.nodes if args.nodes is not None else cfg.trainer.nnodes
    per_node = (
        args.npus_per_node
        if args.npus_per_node is not None
        else (cfg.trainer.n_devices_per_node or per_node_default)
    )
    if nodes < 1 or per_node < 1:
        raise UserError(f"--nodes and --npus-per-node must be >= 1 (got {nodes}, {per_node})")
    if nodes > MAX_NODES or per_node > MAX_NPUS_PER_NODE:
        raise UserError(f"--nodes {nodes} x --npus-per-node {per_node}: at most {MAX_NODES:,} nodes of "
                        f"{MAX_NPUS_PER_NODE} NPUs are checked (docs/limits.md)")
    return card_name, nodes, per_node


def _print_sim(sim_rows: list[dict[str, Any]] | None, sim_note: str) -> None:
    """The simulator's estimate per mode, and ASP's throughput over the colocated baseline's."""
    if not sim_rows:
        print(f"simulator: {sim_note}")
        return
    print(sim_note)
    w = max(len(r["mode"]) for r in sim_rows)
    print(f"{'mode':<{w}}  {'iteration (s)':>13}  {'throughput (tok/s)':>18}  layout")
    for r in sim_rows:
        print(f"{r['mode']:<{w}}  {r['iteration_s']:>13.1f}  {r['throughput_tok_s']:>18,.0f}  {r['layout']}")
    if len(sim_rows) == 2 and sim_rows[1]["throughput_tok_s"] > 0:
        ratio = sim_rows[0]["throughput_tok_s"] / sim_rows[1]["throughput_tok_s"]
        print(f"asp / mindspeed-sync throughput: {ratio:.2f}x")


def _parser() -> Any:
    p = command_parser("check", "validate a config against a cluster without touching hardware")
    p.add_argument("--config", required=True, help="YAML config (e.g. configs/npu/qwen25_7b_a2_1node.yaml)")
    p.add_argument("--nodes", type=int, default=None, help="nodes in the cluster (default: trainer.nnodes)")
    p.add_argument(
        "--npus-per-node",
        type=int,
        default=None,
        help="NPUs per node (default: trainer.n_devices_per_node, else the card's)",
    )
    p.add_argument("--card", default=None, help="910b | 910b4 | a2 | a3 (default: trainer.card)")
    p.add_argument("--no-sim", action="store_true", help="skip the simulator's estimate")
    p.add_argument("--json", action="store_true", help="print the layout as JSON instead of tables")
    p.add_argument("--suggest", action="store_true",
                   help="search the cluster's asynchronous layouts and print the best few (simulated)")
    p.add_argument("--calib", default=None,
                   help="asp-calib/1 file from `asp-npu calibrate` on the cluster's host: its measured host "
                   "optimizer step replaces the documented figure (trainer.host_optimizer_s_per_param)")
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    overrides = list(args.overrides)
    if args.calib is not None:
        from asp_npu.deploy.estimate import calibrated_host_optimizer

        overrides.append(f"trainer.host_optimizer_s_per_param={calibrated_host_optimizer(args.calib)!r}")
    cfg = load_config(args.config, overrides, check=False)
    card_name, nodes, per_node = _cluster(args, cfg)
    cfg = _layout(cfg, nodes, per_node, card_name, args.suggest, sys.stderr if args.json else sys.stdout)
    lay = check(cfg, nodes, per_node, card_name)
    sim_rows, sim_note = (
        (None, "skipped (--no-sim)") if args.no_sim or lay.problems else sim_estimate(cfg, lay)
    )
    if args.json:
        print(json.dumps({**lay.to_dict(), "simulator": sim_rows, "simulator_note": sim_note}, indent=1))
    else:
        print(f"asp-npu check: {args.config}")
        print(format_layout(cfg, lay))
        if not lay.problems:
            print("")
            _print_sim(sim_rows, sim_note)
        for w_ in lay.warnings:
            print(f"warning: {w_}")
    if lay.problems:
        for prob in lay.problems:
            print(f"asp-npu check: problem: {prob}", file=sys.stderr)
        print(
            f"asp-npu check: error: {len(lay.problems)} problem(s) in {args.config} for {nodes} node(s) x "
            f"{per_node} NPUs",
            file=sys.stderr,
        )
        return 2
    if not args.json:
        print(f"OK: {args.config} fits {nodes} node(s) x {per_node} NPUs")
    return 0
