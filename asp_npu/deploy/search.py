"""The layout search: which split of a cluster's NPUs runs ASP fastest, among those that fit.

Inputs: a config (model, batch shape, trace shape; its own layout is the starting point) and a cluster
(nodes x NPUs per node of a card, the card's host memory). The one call, `search`, enumerates for the
asynchronous mode

    rollout instances x instance TP   x   trainer TP x PP x CP x DP   x   recompute   x   offload fraction

(instances take every NPU the trainer leaves; recompute none | full -- selective stores what none does
under flash attention, `asp_npu.deploy.memory`; optimizer offload 0 | 0.5 | 1 of the distributed
optimizer's state to the host), keeps those `asp-npu check` passes (placement, device memory of every
stage and of an instance, host memory per node), keeps per split the variant the cost model says is
cheapest (less recompute and offload are faster), ranks the splits by the predicted stage balance and
simulates the best `SIMULATED` of them with the simulator core every run uses (`asp_npu.sim`, via
`asp_npu.deploy.estimate`). Output: the simulated splits best first, and the colocated baseline
(mindspeed-sync on every NPU of the same cluster) for comparison. A static choice: the split does not
change while a run goes.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from asp_npu.arch import ModelDims
from asp_npu.config import COLOCATED_MODES, Config, validate
from asp_npu.deploy.arch import resolve_arch
from asp_npu.deploy.estimate import ASP_LAG_FOR_SYNC_CONFIGS
from asp_npu.deploy.layout import Card, Deployment, plan_layout
from asp_npu.deploy.memory import instance_npus, seq_len
from asp_npu.errors import UserError

SIMULATED = 5  # splits simulated after the analytic ranking
PP_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
OFFLOAD_FRACTIONS = (0.0, 0.5, 1.0)
RECOMPUTE = ("", "full")
CP_FROM_TOKENS = 16384  # context parallelism is tried for sequences at least this long (dense models)


@dataclass(frozen=True)
class Candidate:
    """One layout of the asynchronous mode."""

    instances: int
    infer_tp: int
    tp: int
    pp: int
    cp: int
    dp: int
    recompute: str  # "" | "full"
    offload: float  # optimizer_offload_fraction (0 = the state stays on the NPU)
    instance_npus: int = 0  # an expert-parallel instance's group (0 = infer_tp)

    @property
    def trainer_npus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def describe(self) -> str:
        group = f" ({self.instance_npus} NPUs)" if self.instance_npus > self.infer_tp else ""
        return (
            f"{self.instances} x TP{self.infer_tp}{group} rollout + trainer TP{self.tp} x PP{self.pp}"
            + (f" x CP{self.cp}" if self.cp > 1 else "")
            + f" x DP{self.dp}"
            + (", full recompute" if self.recompute else "")
            + (f", optimizer {self.offload:.0%} on host" if self.offload else "")
        )


@dataclass
class Scored:
    cand: Candidate
    cfg: Config
    lay: Deployment
    iteration_s: float = math.inf
    throughput_tok_s: float = 0.0
    predicted_s: float = math.inf  # max(rollout, training) per iteration, from mean lengths


@dataclass
class SearchResult:
    ranked: list[Scored]  # simulated, best throughput first
    tried: int  # candidates enumerated
    fitting: int  # of which `check` passes
    baseline: dict[str, Any] | None = None  # colocated mindspeed-sync on the same cluster
    blocker: str = ""  # no candidate fits: what does not fit at offload 100% and full recompute
    notes: list[str] = field(default_factory=list)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def balanced_stages(layers: int, pp: int) -> list[int]:
    """`layers` over `pp` stages, the first ones one layer longer when they do not divide (num_layer_list)."""
    return [layers // pp + (1 if s < layers % pp else 0) for s in range(pp)]


def _tp_options(arch: ModelDims, per_node: int) -> list[int]:
    return [t for t in _divisors(per_node)
            if arch.num_attention_heads % t == 0 and arch.num_key_value_heads % t == 0]


def _infer_tp_options(base: Config, arch: ModelDims, per_node: int) -> list[int]:
    if base.generate_config.infer_expert_parallel_size > 1:  # an expert-parallel group: kept as given
        return [base.generate_config.infer_tensor_parallel_size]
    return [t for t in _divisors(per_node) if arch.num_attention_heads % t == 0
            and (arch.num_key_value_heads % t == 0 or t % arch.num_key_value_heads == 0)]


def candidates(base: Config, arch: ModelDims, nodes: int, per_node: int) -> Iterator[Candidate]:
    """Every asynchronous layout of `nodes` x `per_node` NPUs, trainer variants cheapest first."""
    total = nodes * per_node
    cps = [1, 2, 4] if not arch.moe and seq_len(base) >= CP_FROM_TOKENS else [1]
    variants = sorted(((r, o) for r in RECOMPUTE for o in OFFLOAD_FRACTIONS), key=lambda v: (v[1], v[0]))
    k_extra = max(1, base.generate_config.infer_expert_parallel_size // max(
        1, base.generate_config.infer_tensor_parallel_size))
    for itp in _infer_tp_options(base, arch, per_node):
        k = itp * k_extra
        for tp in _tp_options(arch, per_node):
            for pp in (p for p in PP_SIZES if p <= arch.num_layers):
                for cp in cps:
                    for dp in range(1, total // (tp * pp * cp) + 1):
                        instances = (total - tp * pp * cp * dp) // k
                        if instances < 1:
                            break
                        for rec, off in variants:
                            yield Candidate(instances, itp, tp, pp, cp, dp, rec, off, k)


def apply(base: Config, cand: Candidate, mode: str = "asp") -> Config:
    """`base` with the candidate's layout written into its keys (a new config; `base` is not changed)."""
    act0 = base.actor_config
    cfg = replace(base, generate_config=replace(base.generate_config), rl_config=replace(base.rl_config),
                  actor_config=replace(act0, num_layer_list=list(act0.num_layer_list)),
                  model=replace(base.model))
    gen, act = cfg.generate_config, cfg.actor_config
    cfg.rl_config.mode, cfg.rl_config.layout = mode, ""
    if gen.infer_expert_parallel_size <= 1:
        gen.infer_tensor_parallel_size = cand.infer_tp
    gen.num_instances = cand.instances
    if act.pipeline_model_parallel_size != cand.pp or len(act.num_layer_list) not in (0, cand.pp):
        act.num_layer_list = []
    act.tensor_model_parallel_size, act.pipeline_model_parallel_size = cand.tp, cand.pp
    act.context_parallel_size, act.data_parallel_size = cand.cp, cand.dp
    act.sequence_parallel = cand.tp > 1  # megatron's advice with TP (and required by MoE with TP)
    if mode not in COLOCATED_MODES:
        act.offload_train_optimizer = act.offload_train_grad = act.offload_train_param = False
        if base.rl_config.mode in COLOCATED_MODES:  # a synchronous config: ASP at the shipped configs' lag
            cfg.rl_config.max_lag = max(cfg.rl_config.max_lag, ASP_LAG_FOR_SYNC_CONFIGS)
    act.recompute_granularity = cand.recompute
    act.recompute_method = "uniform" if cand.recompute else ""
    act.recompute_num_layers = 1
    act.optimizer_cpu_offload = cand.offload > 0
    act.optimizer_offload_fraction = cand.offload or 1.0
    if cand.offload > 0:
        act.use_distributed_optimizer = True
    return cfg


def layout_problems(cfg: Config) -> list[str]:
    """`config.validate` for judging a layout: without the initial Megatron weights' folder
    (`model.load_megatron`), whose problems do not depend on the split and which names a folder on the
    cluster: a relative one (MindSpeed-RL's LoRA config has `load: ./`) would be read where the search
    runs, and refuse every split. `asp-npu check` still reports it."""
    return validate(replace(cfg, model=replace(cfg.model, load_megatron="")))


def _batches_fit(base: Config, cand: Candidate) -> bool:
    """What `check` says of the batch shape, without building the layout: whole micro-batches per DP rank
    and a lag window that holds a group per instance."""
    rl = base.rl_config
    lag = max(rl.max_lag, ASP_LAG_FOR_SYNC_CONFIGS) if rl.mode in COLOCATED_MODES else rl.max_lag
    return (rl.mini_batch_size % (cand.dp * base.actor_config.micro_batch_size) == 0
            and (lag + 1) * rl.mini_batch_size >= cand.instances * rl.n_samples_per_prompt)


def _fit(base: Config, cand: Candidate, arch: ModelDims, nodes: int, per_node: int, card: Card
         ) -> tuple[tuple[Config, Deployment] | None, list[str]]:
    """(the candidate's config and layout, or None) and the check's problems."""
    cfg = apply(base, cand)
    if not cfg.actor_config.num_layer_list and arch.num_layers % cand.pp:
        cfg.actor_config.num_layer_list = balanced_stages(arch.num_layers, cand.pp)
    lay = plan_layout(cfg, nodes, per_node, card)
    problems = lay.problems or layout_problems(cfg)
    return (None if problems else (cfg, lay)), problems


def search(base: Config, nodes: int, per_node: int, card: Card, top: int = SIMULATED) -> SearchResult:
    """The fitting asynchronous layouts of the cluster, simulated, best first (see the module doc)."""
    cfg0 = copy.deepcopy(base)
    cfg0.model.build_if_missing = True  # the model folder lives on the cluster, not necessarily here
    arch, problems, _ = resolve_arch(cfg0)
    if arch is None or problems:
        raise UserError("layout search: " + ("; ".join(problems) or "the model's architecture is unknown"))
    fitting: dict[tuple[int, ...], list[Scored]] = {}  # split -> its fitting recompute/offload variants
    bad: set[tuple[Any, ...]] = set()  # trainer shapes / instance TPs whose device memory never fits
    tried = 0
    for cand in candidates(cfg0, arch, nodes, per_node):
        tried += 1
        trainer = (cand.tp, cand.pp, cand.cp, cand.dp, cand.recompute, cand.offload)
        if trainer in bad or ("instance", cand.infer_tp) in bad or not _batches_fit(cfg0, cand):
            continue
        got, problems = _fit(cfg0, cand, arch, nodes, per_node, card)
        if got is not None:
            key = (cand.instances, cand.infer_tp, cand.tp, cand.pp, cand.cp, cand.dp)
            fitting.setdefault(key, []).append(Scored(cand, *got))
        elif any(p.startswith("memory: trainer") for p in problems):
            bad.add(trainer)  # the same trainer beside any rollout side
        elif any(p.startswith("memory: a rollout instance") for p in problems):
            bad.add(("instance", cand.infer_tp))
    result = SearchResult([], tried, sum(len(v) for v in fitting.values()))
    if not fitting:
        result.blocker = blocker(cfg0, arch, nodes, per_node, card)
        return result
    result.ranked = _simulate(list(fitting.values()), top)
    result.baseline = colocated_baseline(cfg0, nodes, per_node, card)
    return result


def _simulate(splits: list[list[Scored]], top: int) -> list[Scored]:
    """Per split its variant of least predicted time; rank the splits by the predicted stage balance and
    simulate the best `top` (asp); best simulated first."""
    from asp_npu.deploy.estimate import build_preset
    from asp_npu.sim.modes import DeviceSplit, predicted_stage_seconds
    from asp_npu.sim.run import build_workload, simulate_layout

    first = splits[0][0]
    workload = build_workload(build_preset(first.cfg, first.lay))  # the same prompts for every split
    pool = []
    for variants in splits:
        for s in variants:
            preset = build_preset(s.cfg, s.lay)
            _, s.predicted_s = predicted_stage_seconds(  # training time decides between a split's variants
                preset, workload, s.cand.instances, s.lay.trainer_npus)
        best = min(variants, key=lambda s: s.predicted_s)
        best.predicted_s = max(predicted_stage_seconds(build_preset(best.cfg, best.lay), workload,
                                                       best.cand.instances, best.lay.trainer_npus))
        pool.append(best)
    pool.sort(key=lambda s: (s.predicted_s, s.cand.trainer_npus))
    seen: set[tuple[int, int, int]] = set()
    distinct = []  # the simulator sees instances x instance NPUs + trainer NPUs: simulate each such once
    for s in pool:
        if (shape := (s.cand.instances, s.cand.infer_tp, s.cand.trainer_npus)) not in seen:
            seen.add(shape)
            distinct.append(s)
    pool = distinct
    for s in pool[:top]:
        preset = build_preset(s.cfg, s.lay)
        sim_lay = DeviceSplit(s.lay.rollout_npus + s.lay.trainer_npus, s.cand.instances,
                            s.lay.rollout_npus // s.cand.instances, s.lay.trainer_npus)
        m = simulate_layout(preset, workload, "asp", sim_lay).metrics
        s.iteration_s, s.throughput_tok_s = m["iteration_time_mean_s"], m["throughput_tokens_per_s"]
    return sorted(pool[:top], key=lambda s: -s.throughput_tok_s)


def colocated_baseline(base: Config, nodes: int, per_node: int, card: Card) -> dict[str, Any] | None:
    """mindspeed-sync on every NPU of the cluster with the config's own trainer TP/PP/CP: its simulated
    iteration, and whether `check` passes it."""
    from asp_npu.deploy.estimate import build_preset
    from asp_npu.sim.run import build_workload, simulate

    cfg = copy.deepcopy(base)
    act = cfg.actor_config
    cfg.rl_config.mode, cfg.rl_config.layout, cfg.rl_config.max_lag = "mindspeed-sync", "", 0
    act.optimizer_cpu_offload = False
    replica = act.tensor_model_parallel_size * act.pipeline_model_parallel_size * act.context_parallel_size
    act.data_parallel_size = max(1, nodes * per_node // replica)
    lay = plan_layout(cfg, nodes, per_node, card)
    if lay.problems:  # as MindSpeed-RL's colocated configs run: trainer state off the NPU while generating
        act.offload_train_optimizer = act.offload_train_grad = act.offload_train_param = True
        cfg.generate_config.gpu_memory_utilization = min(cfg.generate_config.gpu_memory_utilization, 0.6)
        lay = plan_layout(cfg, nodes, per_node, card)
    if lay.arch is None or not lay.instances or not lay.trainer:
        return None
    preset = build_preset(cfg, lay)
    m = simulate(preset, build_workload(preset), "mindspeed-sync").metrics
    return {"mode": "mindspeed-sync", "iteration_s": m["iteration_time_mean_s"],
            "throughput_tok_s": m["throughput_tokens_per_s"],
            "fits": not (lay.problems or layout_problems(cfg)), "problems": list(lay.problems)}


def blocker(base: Config, arch: ModelDims, nodes: int, per_node: int, card: Card) -> str:
    """Why nothing fits: the check's memory problems of the smallest-footprint layout (the largest trainer
    TP x PP with one rollout instance, full recompute, the whole optimizer state on the host)."""
    total = nodes * per_node
    best: tuple[int, list[str]] | None = None
    for cand in candidates(base, arch, nodes, per_node):
        if cand.instances != 1 or cand.recompute != "full" or cand.offload != 1.0 or cand.cp != 1:
            continue
        cfg = apply(base, cand)
        if not cfg.actor_config.num_layer_list and arch.num_layers % cand.pp:
            cfg.actor_config.num_layer_list = balanced_stages(arch.num_layers, cand.pp)
        probs = plan_layout(cfg, nodes, per_node, card).problems or layout_problems(cfg)
        score = cand.tp * cand.pp * 1000 - cand.dp
        if probs and (best is None or score > best[0]):
            best = (score, [f"{cand.describe()}: {probs[0]}"])
    if best:
        return best[1][0]
    gen, k = base.generate_config, instance_npus(base)
    return (f"a rollout instance takes {k} of the {total} NPUs (generate_config infer TP"
            f"{gen.infer_tensor_parallel_size} x EP{gen.infer_expert_parallel_size}), leaving "
            f"{max(0, total - k)} for the trainer: no asynchronous layout holds a trainer and one instance")


def format_result(res: SearchResult, shown: int = 5) -> list[str]:
    """The top `shown` splits with their simulated iteration next to the colocated baseline's."""
    lines = [f"layout search: {res.tried} layouts tried, {res.fitting} fit (device and host memory); "
             f"the best {len(res.ranked)} distinct splits by predicted stage balance simulated (mode asp; "
             "x = the colocated baseline's iteration / this one's):"]
    if not res.ranked:
        return lines + [f"  none fits: {res.blocker}"]
    base = res.baseline
    for i, s in enumerate(res.ranked[:shown]):
        vs = f"  {base['iteration_s'] / s.iteration_s:.2f}x" if base and s.iteration_s > 0 else ""
        host = f", host {s.lay.host_gib_per_node:.0f} GiB/node" if s.lay.host_gib_per_node else ""
        lines.append(f"  {'*' if i == 0 else ' '} {s.iteration_s:8.1f} s/iteration "
                     f"{s.throughput_tok_s:10,.0f} tok/s{vs}  {s.cand.describe()}{host}")
    if base:
        lines.append(f"    {base['iteration_s']:8.1f} s/iteration {base['throughput_tok_s']:10,.0f} tok/s  "
                     f"colocated baseline (mindspeed-sync on every NPU"
                     + (")" if base["fits"] else "; does not pass check)"))
    return lines


def chosen(res: SearchResult, where: str) -> Scored:
    """The best split, or a one-line refusal naming what does not fit."""
    if not res.ranked:
        raise UserError(f"{where}: no asynchronous layout fits: {res.blocker}")
    return res.ranked[0]


def apply_layout_auto(cfg: Config, nodes: int, per_node: int, card: Card) -> tuple[Config, list[str]]:
    """`rl_config.layout: auto`: the config with the search's choice written in (layout reset to "")."""
    from asp_npu.config import _layout_auto_problems

    bad = _layout_auto_problems(cfg)
    if bad:
        raise UserError(bad[0])
    if cfg.rl_config.mode in COLOCATED_MODES:
        raise UserError(f"rl_config.layout: auto chooses an asynchronous split; mode '{cfg.rl_config.mode}' "
                        "is colocated on every NPU")
    res = search(cfg, nodes, per_node, card)
    best = chosen(res, "rl_config.layout: auto")
    out = apply(cfg, best.cand, cfg.rl_config.mode)
    out.actor_config.num_layer_list = best.cfg.actor_config.num_layer_list
    out.model.build_if_missing = cfg.model.build_if_missing
    return out, format_result(res)


def resolve_layout(cfg: Config) -> Config:
    """A run's config with `rl_config.layout: auto` resolved on its cluster (trainer.nnodes x
    n_devices_per_node of trainer.card); any other config unchanged."""
    if cfg.rl_config.layout != "auto":
        return cfg
    from asp_npu.deploy.layout import card_for

    try:
        card = card_for(cfg.trainer.card)
    except KeyError as exc:
        raise UserError(str(exc.args[0])) from None
    per_node = cfg.trainer.n_devices_per_node or card.npus_per_node
    out, lines = apply_layout_auto(cfg, cfg.trainer.nnodes, per_node, card)
    print("\n".join(lines), flush=True)
    return out
