"""`asp-npu check --config FILE [--nodes N --npus-per-node M]`: validate a config for a cluster
before queueing for it, without touching hardware.

Prints the layout (which NPUs run which rollout instance or trainer rank), the per-NPU memory
estimate of each role, and the simulator's estimate of iteration time and throughput for ASP and
`mindspeed-sync` on that layout. A bad config lists every problem on stderr and exits 2.
"""

from __future__ import annotations

import os
from pathlib import Path

from asp_npu.config import Config, validate, with_changes
from asp_npu.deploy.layout import Deployment, card_for, plan_layout
from asp_npu.deploy.memory import instance_npus
from asp_npu.device import host_only
from asp_npu.errors import UserError


def _ranges(xs: list[int]) -> str:
    """[0,1,2,5] -> '0-2,5' (how NPU lists read in ASCEND_RT_VISIBLE_DEVICES docs)."""
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ",".join(out)


def format_layout(cfg: Config, lay: Deployment) -> str:
    lines = _summary_lines(cfg, lay)
    lines.append("")
    lines += _placement_lines(cfg, lay)
    if lay.memory:
        lines.append("")
        lines += _memory_lines(lay)
    return "\n".join(lines)


def _infer_ep(cfg: Config) -> str:
    """The rollout's expert-parallel suffix, shown only when experts are split."""
    ep = cfg.generate_config.infer_expert_parallel_size
    return f" x EP{ep}" if ep > 1 else ""


def _trainer_shape(cfg: Config) -> str:
    """The trainer's parallel sizes as users write them (CP and EP only where they are used)."""
    act = cfg.actor_config
    experts = act.expert_model_parallel_size > 1
    return (
        f"TP{act.tensor_model_parallel_size} x PP{act.pipeline_model_parallel_size}"
        + (f" x CP{act.context_parallel_size}" if act.context_parallel_size > 1 else "")
        + f" x DP{act.data_parallel_size}"
        + (f" (EP{act.expert_model_parallel_size}" if experts else "")
        + (f" x expert TP{act.expert_tensor_parallel_size}" if experts
           and act.expert_tensor_parallel_size else "")
        + (")" if experts else "")
        + (f"; stages of {'+'.join(map(str, act.num_layer_list))} layers" if act.num_layer_list else "")
    )


def _summary_lines(cfg: Config, lay: Deployment) -> list[str]:
    """Cluster, model and mode lines: what the check was run against, before any table."""
    lines = [
        f"cluster: {lay.nodes} node(s) x {lay.npus_per_node} NPUs = {lay.total_npus} ({lay.card.description})"
    ]
    if lay.arch is not None:
        a = lay.arch
        lines.append(f"model:   {a.describe()} from {lay.arch_source}, {cfg.model.dtype}")
    kind = "colocated: rollout and training take turns on the same NPUs" if lay.colocated else "disaggregated"
    per_instance = instance_npus(cfg)
    lines.append(
        f"mode:    {lay.mode} ({kind}); rollout {lay.rollout_npus // per_instance} instances x "
        f"{per_instance} NPUs (infer TP{cfg.generate_config.infer_tensor_parallel_size}{_infer_ep(cfg)}) = "
        f"{lay.rollout_npus} NPUs; trainer {_trainer_shape(cfg)}"
        + f" = {lay.trainer_npus} NPUs; {len(lay.idle)} idle"
    )
    return lines


def _placement_lines(cfg: Config, lay: Deployment) -> list[str]:
    """One row per rollout instance, trainer TP group and idle node, so users see where each NPU goes."""
    tp = cfg.generate_config.infer_tensor_parallel_size
    rows = [("node", "NPUs", "role", "placement")]
    for inst in lay.instances:
        rows.append(
            (
                str(inst.node) if inst.span_nodes == 1 else f"{inst.node}-{inst.node + inst.span_nodes - 1}",
                _ranges(inst.npus),
                "rollout",
                f"instance {inst.instance} (vLLM, TP{tp}{_infer_ep(cfg)})",
            )
        )
    for g in lay.trainer:
        rows.append(
            (
                str(g.node),
                _ranges(g.npus),
                "trainer",
                f"ranks {_ranges(g.ranks)} (TP group; pp stage {g.pp_stage}, dp rank {g.dp_rank})",
            )
        )
    idle: dict[int, list[int]] = {}  # grouped once: linear in the node count
    for n, d in lay.idle:
        idle.setdefault(n, []).append(d)
    for node in sorted(idle):
        rows.append((str(node), _ranges(idle[node]), "idle", ""))
    if len(rows) == 1:
        rows.append(("-", "-", "-", "no placement (see the problems below)"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows]


_MEMORY_ORDER = (
    "trainer_resident",
    "weights",
    "gradients",
    "optimizer",
    "activations",
    "logits",
    "reference",
    "workspace",
    "kv_cache",
    "runtime",
)


def _memory_lines(lay: Deployment) -> list[str]:
    """The per-NPU memory table (only the parts some role has) and each role's notes."""
    keys = [k for k in _MEMORY_ORDER if any(k in m.parts for m in lay.memory)]
    head = ["memory per NPU (GiB)"] + keys + ["total", "budget"]
    table = [head]
    for m in lay.memory:
        table.append(
            [m.role]
            + [f"{m.parts[k]:.1f}" if k in m.parts else "-" for k in keys]
            + [f"{m.total_gib:.1f}", f"{m.budget_gib:.1f}"]
        )
    w = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)) for r in table]
    return lines + [f"  {m.role}: {n}" for m in lay.memory for n in m.notes]


def sim_estimate(cfg: Config, lay: Deployment) -> tuple[list[dict] | None, str]:
    """The simulator's iteration time / throughput for ASP and mindspeed-sync on this layout."""
    from asp_npu.deploy.estimate import estimate

    try:
        return estimate(cfg, lay)
    except Exception as exc:  # the estimate is optional: a simulator failure must not hide the check
        return None, f"simulator failed on this layout ({type(exc).__name__}: {str(exc).splitlines()[0]})"


def check(cfg: Config, nodes: int, npus_per_node: int, card_name: str) -> Deployment:
    """Every problem of `cfg` on this cluster in `Deployment.problems` (config validation included)."""
    try:
        card = card_for(card_name)
    except KeyError as exc:
        raise UserError(str(exc.args[0])) from None
    npus_per_node = npus_per_node or card.npus_per_node  # 0 = the card's (trainer.n_devices_per_node)
    if nodes < 1 or npus_per_node < 1:
        raise UserError(f"a cluster needs >= 1 node and >= 1 NPU per node (got {nodes} x {npus_per_node})")
    # the model folder lives on the cluster, not necessarily here
    as_if_built = with_changes(cfg, {"model.build_if_missing": True})
    lay = plan_layout(cfg, nodes, npus_per_node, card)
    lay.problems = validate(as_if_built) + lay.problems
    nz = os.environ.get("VLLM_ASCEND_ENABLE_NZ", "0")
    if nz != "0":
        lay.problems.append(
            f"VLLM_ASCEND_ENABLE_NZ={nz} in this environment: vllm-ascend's FRACTAL_NZ weight layout breaks "
            "repeated weight refreshes; RL needs 0 (launch/env_npu.sh exports it)"
        )
    if host_only(cfg.trainer.device):
        lay.problems.append("trainer.device: 'cpu' -- this config does not run on NPUs")
    if not Path(cfg.model.path).exists():
        lay.warnings.append(
            f"model.path {cfg.model.path} is not on this machine (fine on a login node; it must "
            "exist on every cluster node)"
        )
    return lay
