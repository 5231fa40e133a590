"""Import and check every MindSpeed-RL RL config in a folder; print one Markdown table row each.

    python benchmarks/mindspeed_configs.py PATH/TO/MindSpeed-RL/configs [--mode asp]

PATH holds MindSpeed-RL's `grpo_*`, `dapo_*`, `ppo_*` YAML files (and its `model/` folder); asp-npu
does not ship them: download them from the MindSpeed-RL repository. Each file is imported with
`asp-npu import-config mindspeed-rl` in mode --mode (the layout search picks the split:
asp_npu/deploy/search.py) and checked with `asp-npu check` on the cluster the file names:
`actor_resource.num_npus` NPUs of the card in the name (A2: 8 per node, A3: 16 per node). A file whose
asynchronous import is refused keeps the refusal (which names the component that does not fit with the
whole optimizer state on the host and full recompute). Columns: the layout chosen, GiB per NPU of the
trainer (worst stage) and of a rollout instance by component, host GiB per node (used / what the node
leaves for it), and the simulated iteration of the chosen split next to the colocated baseline's
(mindspeed-sync on every NPU of the same cluster), both from the search's printout.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from asp_npu.cli.import_config import main as import_main
from asp_npu.config import load_config
from asp_npu.deploy.check import check
from asp_npu.errors import UserError

TRAINER_PARTS = ("weights", "gradients", "optimizer", "activations", "logits", "reference", "runtime")
ROLLOUT_PARTS = ("weights", "workspace", "kv_cache", "runtime")
_BEST = re.compile(r"note:\s+\*\s+([\d.]+) s/iteration")
_BASE = re.compile(r"note:\s+([\d.]+) s/iteration .* colocated baseline "
                   r"\(mindspeed-sync on every NPU(;[^)]*)?\)")
_CHOSEN = re.compile(r"note: layout: .* -> (.*)")


def _import(src: Path, out: Path, mode: str) -> tuple[str, str]:
    """('ok' | the refusal line, what the import printed)."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            import_main(["mindspeed-rl", str(src), "--out", str(out), "--mode", mode])
        return "ok", buf.getvalue()
    except UserError as exc:
        return str(exc).split(": cannot import: ")[-1].replace(str(src) + ": ", ""), buf.getvalue()


def _fmt(parts: dict[str, float], keys: tuple[str, ...]) -> str:
    return " / ".join(f"{parts.get(k, 0.0):.1f}" for k in keys)


def _sim(printed: str) -> str:
    best, base = _BEST.search(printed), _BASE.search(printed)
    if not best:
        return "-"
    if not base:
        return f"{float(best.group(1)):.0f} s"
    ratio = float(base.group(1)) / float(best.group(1))
    fits = " (baseline does not pass check)" if base.group(2) else ""
    return f"{float(best.group(1)):.0f} s vs {float(base.group(1)):.0f} s = {ratio:.2f}x{fits}"


def _memory(lay: Any) -> tuple[str, str, str]:
    trainer = [m for m in lay.memory if m.role.startswith("trainer")]
    rollout = [m for m in lay.memory if m.role.startswith("rollout")]
    worst = max(trainer, key=lambda m: m.total_gib) if trainer else None
    tr = f"{_fmt(worst.parts, TRAINER_PARTS)} = {worst.total_gib:.1f}" if worst else "-"
    ro = f"{_fmt(rollout[0].parts, ROLLOUT_PARTS)} = {rollout[0].total_gib:.1f}" if rollout else "-"
    host = f"{lay.host_gib_per_node:.0f} / {lay.host_budget_gib:.0f}" if lay.host_budget_gib else "-"
    return tr, ro, host


def _verdict(problems: list[str]) -> str:
    """OK, or what fails. The initial Megatron weights' folder (`model.load_megatron`, the file's
    `actor_config.load`) names a folder on the cluster: a relative one that exists here (`./`) is read
    here and is not a checkpoint, so it is shown apart from the layout's verdict."""
    folder = [p for p in problems if p.startswith("model.load_megatron:")]
    rest = [p for p in problems if p not in folder]
    verdict = "OK" if not rest else "FAIL: " + "; ".join(rest)
    return verdict + "".join(f" (on this machine: {p}; a folder on the cluster)" for p in folder)


def row(src: Path, mode: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ours.yaml"
        status, printed = _import(src, out, mode)
        if not out.exists():
            return f"| {src.name} | | refused: {status} | - | - | - | - | - |"
        cfg = load_config(str(out), check=False)
        t = cfg.trainer
        lay = check(cfg, t.nnodes, t.n_devices_per_node, t.card)
        verdict = _verdict(lay.problems)
        chosen = _CHOSEN.search(printed)
        tr, ro, host = _memory(lay)
        cluster = f"{lay.nodes}x{lay.npus_per_node} {t.card or '910b'}"
        layout = chosen.group(1) if chosen else "-"
        return (f"| {src.name} | {cluster} | {cfg.rl_config.mode}: {layout} | {tr} | {ro} | {host} | "
                f"{_sim(printed)} | {verdict} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--mode", default="asp")
    args = p.parse_args(argv)
    files = sorted(f for f in args.folder.glob("*.yaml") if re.match(r"(grpo|dapo|ppo)_", f.name))
    if not files:
        print(f"no grpo_*/dapo_*/ppo_* YAML files in {args.folder}", file=sys.stderr)
        return 2
    print(
        "| config | cluster | mode: layout chosen | trainer GiB/NPU (worst stage): weights / grads / "
        "optimizer / activations / logits / reference / runtime = total | rollout GiB/NPU: weights / "
        "workspace / KV cache / runtime = total | host GiB per node (used / left for the job) | "
        "simulated iteration: asp vs colocated | check |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for f in files:
        print(row(f, args.mode), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
