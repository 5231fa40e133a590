"""Import and check every MindSpeed-RL RL config in a folder; print one Markdown table row each.

    python benchmarks/mindspeed_configs.py PATH/TO/MindSpeed-RL/configs [--mode asp]

PATH holds MindSpeed-RL's `grpo_*`, `dapo_*`, `ppo_*` YAML files (and its `model/` folder); asp-npu
does not ship them: download them from the MindSpeed-RL repository. Each file is imported with
`asp-npu import-config mindspeed-rl` (mode --mode; when that refuses naming another mode, with that
mode; when its check fails and the file runs colocated in MindSpeed-RL, `use_integrated_worker`, as
mindspeed-sync) and checked with `asp-npu check` on the cluster the file names: `actor_resource.num_npus` NPUs
of the card in the name (A2: 8 per node, A3: 16 per node). Columns: GiB per NPU of the trainer
(worst stage) and of the rollout side, by component.
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
from asp_npu.config import COLOCATED_MODES, load_config
from asp_npu.deploy.check import check
from asp_npu.errors import UserError

TRAINER_PARTS = ("weights", "gradients", "optimizer", "activations", "logits", "reference", "runtime")
ROLLOUT_PARTS = ("trainer_resident", "weights", "workspace", "kv_cache", "runtime")


def _import(src: Path, out: Path, mode: str) -> tuple[str, str]:
    """(status, mode used): 'ok', or the refusal line."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            import_main(["mindspeed-rl", str(src), "--out", str(out), "--mode", mode])
        return "ok", mode
    except UserError as exc:
        msg = str(exc)
        m = re.search(r"--mode (\S+) fits", msg) or re.search(r"use --mode (\S+)", msg)
        if m and m.group(1) != mode:
            status, used = _import(src, out, m.group(1))
            return (f"{status} (--mode {used}: asp split does not fit)", used)
        return msg.split(": cannot import: ")[-1], mode


def _fmt(parts: dict[str, float], keys: tuple[str, ...]) -> str:
    return " / ".join(f"{parts.get(k, 0.0):.1f}" for k in keys)


def _integrated(src: Path) -> bool:
    """MindSpeed-RL runs the file colocated (`rl_config.use_integrated_worker: true`)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(src))
    rl = raw.get("rl_config") if isinstance(raw, dict) else None
    return bool(isinstance(rl, dict) and rl.get("use_integrated_worker"))


def _checked(src: Path, out: Path, mode: str) -> tuple[str, str, Any, Any]:
    status, used = _import(src, out, mode)
    if not out.exists():
        return status, used, None, None
    cfg = load_config(str(out), check=False)
    t = cfg.trainer
    return status, used, cfg, check(cfg, t.nnodes, t.n_devices_per_node, t.card)


def row(src: Path, mode: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ours.yaml"
        status, used, cfg, lay = _checked(src, out, mode)
        if cfg is None:
            return f"| {src.name} | | | refused: {status} | - | - | - |"
        if lay.problems and used not in COLOCATED_MODES and _integrated(src):
            out.unlink()
            status, used, cfg, lay = _checked(src, out, "mindspeed-sync")
            status += " (--mode mindspeed-sync: use_integrated_worker, as MindSpeed-RL runs it)"
        t = cfg.trainer
        trainer = [m for m in lay.memory if m.role.startswith("trainer")]
        rollout = [m for m in lay.memory if m.role.startswith("rollout")]
        worst = max(trainer, key=lambda m: m.total_gib) if trainer else None
        verdict = "OK" if not lay.problems else "FAIL: " + "; ".join(lay.problems)
        arch = lay.arch.describe().split(" (")[0] + f" {lay.arch.model_type}" if lay.arch else "?"
        cluster = f"{lay.nodes}x{lay.npus_per_node} {t.card or '910b'} ({used})"  # as check resolved it
        tr = f"{_fmt(worst.parts, TRAINER_PARTS)} = {worst.total_gib:.1f}" if worst else "-"
        ro = f"{_fmt(rollout[0].parts, ROLLOUT_PARTS)} = {rollout[0].total_gib:.1f}" if rollout else "-"
        return f"| {src.name} | {arch} | {cluster} | {status} | {verdict} | {tr} | {ro} |"


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
        "| config | model | cluster (mode) | import | check | trainer GiB/NPU: weights / grads / optimizer / "
        "activations / logits / reference / runtime = total | rollout GiB/NPU: trainer resident / weights / "
        "workspace / KV cache / runtime = total |"
    )
    print("|---|---|---|---|---|---|---|")
    for f in files:
        print(row(f, args.mode), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
