"""The ASP planner: one offline pass of padding -> skewness -> sorting, then a lag-bounded timeline.

`plan(groups, cfg)` is the one entry point (the simulator, the pipeline controller and `asp-npu plan`
call it). The lag-bound definition it guarantees is in `asp_npu.schedule` (package docstring) and is
checked independently by `check_lag_bound`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from asp_npu.errors import InvalidValue
from asp_npu.schedule.cost import CostModel, group_kv_token_steps
from asp_npu.schedule.padding import cut_units, divisors, groups_per_unit, length_order
from asp_npu.schedule.plan import Groups, RolloutPlan
from asp_npu.schedule.skewness import balance, bands, deal, even_cuts, lpt, polish
from asp_npu.schedule.sorting import ORDERINGS, instance_orders
from asp_npu.schedule.timeline import Timeline, timeline
from asp_npu.validation import INT32_MAX, SEED_MAX, check_float, check_int

MAX_INSTANCES = 65536  # rollout instances one plan may address


@dataclass(frozen=True)
class PlannerConfig:
    num_instances: int
    minibatch: int  # samples per trainer step (whole groups)
    group_size: int
    max_num_seqs: int = 256  # concurrent sequence slots per instance
    max_lag: int = 1  # policy-lag bound in weight versions (0 = synchronous)
    train_step_s: float = 0.0  # trainer seconds per minibatch (estimate; 0 = instant)
    cost: CostModel = field(default_factory=CostModel)
    seed: int = 0
    # skewness may cut units smaller than `unit_size` wherever that evens the predicted token loads
    # (still length-homogeneous): for executors that stream an instance's units through continuous
    # batching. Off, smaller units only where a blocking per-unit executor (which pays a batch per
    # unit) is no busier on the cost model (`skewed_units`).
    split_units: bool = False

    def validate(self) -> None:
        """Every field in range (NaN and inf refused): raises InvalidValue (a ValueError)."""
        check_int("num_instances", self.num_instances, 1, MAX_INSTANCES)
        check_int("group_size", self.group_size, 1, INT32_MAX)
        check_int("minibatch", self.minibatch, 1, INT32_MAX)
        if self.minibatch % self.group_size:
            raise InvalidValue(
                f"minibatch {self.minibatch} is not a positive multiple of the group size {self.group_size}"
            )
        check_int("max_num_seqs", self.max_num_seqs, 1, INT32_MAX)
        check_int("max_lag", self.max_lag, 0, INT32_MAX)
        check_float("train_step_s", self.train_step_s, 0.0, 1e9)
        check_int("seed", self.seed, 0, SEED_MAX)
        if not isinstance(self.split_units, bool):
            raise InvalidValue(f"split_units must be true or false (got {self.split_units!r})")
        if not isinstance(self.cost, CostModel):
            raise InvalidValue(f"cost must be a CostModel (got {type(self.cost).__name__})")


def check_plan_flags(
    epoch: int,
    instances: int,
    minibatch: int,
    max_num_seqs: int,
    max_lag: int,
    train_step_s: float,
    cost_abc: tuple[float, float, float],
    seed: int,
) -> CostModel:
    """`asp-npu plan`'s numbers, named by their flags, before the trace is read (the group size is
    checked after); returns the cost model."""
    check_int("--epoch", epoch, 0, INT32_MAX)
    check_int("--instances", instances, 1, MAX_INSTANCES)
    check_int("--minibatch", minibatch, 1, INT32_MAX)
    check_int("--max-num-seqs", max_num_seqs, 1, INT32_MAX)
    check_int("--max-lag", max_lag, 0, INT32_MAX)
    check_float("--train-step-s", train_step_s, 0.0, 1e9)
    for flag, v in zip(("--cost-a", "--cost-b", "--cost-c"), cost_abc, strict=True):
        check_float(flag, v, 0.0, 1e6)
    check_int("--seed", seed, 0, SEED_MAX)
    cost = CostModel(*cost_abc)
    PlannerConfig(instances, minibatch, 1, max_num_seqs, max_lag, train_step_s, cost, seed).validate()
    return cost


@dataclass
class UnitTable:
    """Units before timing: their groups (unit by unit), offsets, predicted seconds and sizes."""

    group_order: np.ndarray  # group ids, unit by unit
    offsets: np.ndarray  # (u+1,) into group_order
    seconds: np.ndarray  # (u,)
    sizes: np.ndarray  # (u,) samples
    last_unit: int  # the remainder unit admitted after all others (-1 if none)


def unit_costs(
    groups: Groups, group_order: np.ndarray, offsets: np.ndarray, cfg: PlannerConfig
) -> np.ndarray:
    """Predicted seconds of each unit under the cost model (q90 of a group stands for its longest)."""
    n = groups.group_size
    starts = offsets[:-1]
    longest = np.maximum.reduceat(groups.q90[group_order], starts)
    tokens = np.add.reduceat(groups.mean[group_order], starts) * n
    kv: np.ndarray | float = 0.0
    if cfg.cost.c > 0:
        pl = None if groups.prompt_lens is None else groups.prompt_lens[group_order]
        kv = np.add.reduceat(group_kv_token_steps(groups.mean[group_order], pl, n), starts)
    return cfg.cost.unit_seconds(longest, tokens, cfg.max_num_seqs, kv)


def unit_size(groups: Groups, cfg: PlannerConfig) -> int:
    """Groups per unit (the same for ASP and the baselines, whatever order they cut)."""
    return groups_per_unit(cfg.minibatch, cfg.group_size, cfg.max_num_seqs, len(groups), cfg.num_instances)


def make_units(groups: Groups, cfg: PlannerConfig, order: np.ndarray) -> UnitTable:
    """Cut `order` (group ids) into units of `unit_size` groups; the remainder unit goes last."""
    c = unit_size(groups, cfg)
    return unit_table(groups, cfg, *cut_units(order, c), c)


def unit_table(
    groups: Groups, cfg: PlannerConfig, group_order: np.ndarray, offsets: np.ndarray, c: int
) -> UnitTable:
    """Units of `c` groups (the last may be smaller: the remainder) with their predicted seconds."""
    sizes = np.diff(offsets) * cfg.group_size
    last = int(sizes.size - 1) if sizes.size and sizes[-1] != c * cfg.group_size else -1
    return UnitTable(group_order, offsets, unit_costs(groups, group_order, offsets, cfg), sizes, last)


def check_lag_bound(plan: RolloutPlan, cfg: PlannerConfig) -> list[str]:
    """Independent check that a finished plan respects the lag bound; returns violations (empty = ok).

    Uses only the plan's own columns (unit start/finish/target step, trainer step ends), not the
    planner's bookkeeping: (1) admission: samples of all units started at or before a unit's start
    fit `(max_lag + version + 1) * M`, version = trainer steps ended by then; (2) lag: every unit's
    target step minus its start version is at most `max_lag`; (3) causality: a unit finishes before
    its target step starts, steps do not overlap, and steps 0..j consume at most (j+1)*M samples.
    """
    problems: list[str] = []
    M, L, T = cfg.minibatch, cfg.max_lag, cfg.train_step_s
    sizes = plan.unit_sizes
    ends = np.asarray(plan.trainer_step_end, dtype=np.float64)
    order = np.lexsort((np.arange(plan.num_units), plan.unit_start))
    starts = plan.unit_start[order]
    cum = np.cumsum(sizes[order])
    admitted = cum[np.searchsorted(starts, starts, side="right") - 1]  # simultaneous starts count together
    versions = np.searchsorted(ends, starts, side="right")
    bound = (L + versions + 1) * M
    for i in np.flatnonzero(admitted > bound)[:5]:
        problems.append(
            f"unit {int(order[i])} starts at {starts[i]:.4g}s with {int(admitted[i])} samples "
            f"admitted > {int(bound[i])}"
        )
    ver = np.empty(plan.num_units, dtype=np.int64)
    ver[order] = versions
    lag = plan.unit_target_step - ver
    for u in np.flatnonzero((lag > L) | (lag < 0))[:5]:
        problems.append(
            f"unit {int(u)}: target step {int(plan.unit_target_step[u])} - version {int(ver[u])} "
            f"outside [0, {L}]"
        )
    if plan.num_units and (plan.unit_target_step.max() >= ends.size or plan.unit_target_step.min() < 0):
        problems.append("a unit targets a trainer step that does not exist")
        return problems
    step_start = ends - T
    late = plan.unit_finish > step_start[plan.unit_target_step] + 1e-9 * np.maximum(1.0, plan.unit_finish)
    for u in np.flatnonzero(late)[:5]:
        problems.append(
            f"unit {int(u)} finishes after its target step {int(plan.unit_target_step[u])} starts"
        )
    if ends.size > 1 and np.any(step_start[1:] < ends[:-1] - 1e-9 * np.maximum(1.0, ends[:-1])):
        problems.append("trainer steps overlap")
    per_step = np.bincount(plan.unit_target_step, weights=sizes, minlength=ends.size)
    if np.any(np.cumsum(per_step) > (np.arange(ends.size) + 1) * M):
        # a unit is counted at its last step, so cumulative counts may only lag behind the minibatches
        problems.append("more samples consumed by a step than minibatches allow")
    return problems


# ----------------------------------------------------------------------------------------- assembly


def plan_timeline(instance_order: list[list[int]], units: UnitTable, cfg: PlannerConfig) -> Timeline:
    """Planned start/finish of every unit and end of every trainer step for one per-instance order."""
    return timeline(
        instance_order, units.seconds, units.sizes, cfg.minibatch, cfg.max_lag, cfg.train_step_s,
        units.last_unit,
    )


def assemble(
    groups: Groups,
    cfg: PlannerConfig,
    units: UnitTable,
    assign: np.ndarray,
    instance_order: list[list[int]],
    dispatch: str,
    t0: float,
    tl: Timeline | None = None,
) -> RolloutPlan:
    """Time the plan (unless its timeline `tl` is given), renumber units by planned start, and lay
    out the columnar RolloutPlan."""
    if tl is None:
        tl = plan_timeline(instance_order, units, cfg)
    u_count = units.seconds.size
    renum = np.lexsort((assign, tl.start))  # new id -> old id
    n = groups.group_size
    g_counts = np.diff(units.offsets)[renum]
    g_rows = (
        np.concatenate([units.group_order[units.offsets[u] : units.offsets[u + 1]] for u in renum])
        if u_count
        else np.array([], dtype=np.int64)
    )
    sample_group = np.repeat(g_rows, n)
    sample_idx = groups.sample_idxs[g_rows].ravel()
    pred = np.maximum(1, np.rint(groups.mean[g_rows])).astype(np.int64)
    plan = RolloutPlan(
        group_prompt_ids=groups.prompt_ids,
        sample_group=sample_group,
        sample_idx=sample_idx,
        sample_predicted_len=np.repeat(pred, n),
        unit_offsets=np.r_[0, np.cumsum(g_counts * n)].astype(np.int64),
        unit_instance=assign[renum].astype(np.int64),
        unit_start=tl.start[renum],
        unit_finish=tl.finish[renum],
        unit_target_step=tl.target_step[renum],
        num_instances=cfg.num_instances,
        trainer_step_end=tl.step_end,
    )
    plan.summary = plan_summary(groups, cfg, units, assign, tl, dispatch, t0)
    return plan


def _imbalance(values: np.ndarray) -> float:
    """max / mean - 1 of per-instance loads (0 for an empty plan)."""
    return round(float(values.max() / values.mean() - 1), 5) if values.mean() > 0 else 0.0


def plan_summary(groups: Groups, cfg: PlannerConfig, units: UnitTable, assign: np.ndarray, tl: Timeline,
                 dispatch: str, t0: float) -> dict[str, object]:
    """The plan's predicted figures: makespan against its lower bound, balance, lag, trainer idle."""
    u_count = units.seconds.size
    n = groups.group_size
    loads = (
        np.bincount(assign, weights=units.seconds, minlength=cfg.num_instances) if u_count else np.zeros(1)
    )
    unit_tokens = np.add.reduceat(groups.mean[units.group_order], units.offsets[:-1]) if u_count else None
    tokens = (
        np.bincount(assign, weights=unit_tokens, minlength=cfg.num_instances) if u_count else np.zeros(1)
    )
    makespan = float(tl.finish.max()) if u_count else 0.0
    lower = float(max(units.seconds.sum() / cfg.num_instances, units.seconds.max())) if u_count else 0.0
    lag = tl.target_step - tl.version
    return {
        "dispatch": dispatch,
        "samples": groups.num_samples,
        "groups": len(groups),
        "instances": cfg.num_instances,
        "units": int(u_count),
        "unit_samples": int(units.sizes.max()) if u_count else 0,
        "group_size": n,
        "minibatch": cfg.minibatch,
        "max_lag": cfg.max_lag,
        "predicted_makespan": round(makespan, 4),
        "lower_bound": round(lower, 4),
        "makespan_ratio": round(makespan / lower, 4) if lower > 0 else 1.0,
        "predicted_load_imbalance": _imbalance(loads),
        "predicted_token_imbalance": _imbalance(tokens),
        "trainer_steps": int(tl.step_end.size),
        "predicted_trainer_end": round(float(tl.step_end[-1]), 4) if tl.step_end.size else 0.0,
        "admission_wait_s": round(tl.admission_wait_s, 4),
        "trainer_idle_s": round(tl.trainer_idle_s, 4),
        "max_planned_lag": int(lag.max()) if u_count else 0,
        "mean_planned_lag": round(float(np.average(lag, weights=units.sizes)), 4) if u_count else 0.0,
        "seed": cfg.seed,
        "plan_seconds": round(time.perf_counter() - t0, 4),
        "warnings": capacity_warnings(cfg, int(units.sizes.max()) if u_count else 0, u_count),
    }


def capacity_warnings(cfg: PlannerConfig, unit_samples: int, num_units: int) -> list[str]:
    """Say when the lag bound, not the planner, will keep instances idle (a configuration matter)."""
    room = (cfg.max_lag + 1) * cfg.minibatch
    busy = min(cfg.num_instances, num_units) * unit_samples
    if unit_samples and room < busy:
        return [
            f"(max_lag {cfg.max_lag} + 1) x minibatch {cfg.minibatch} = {room} samples may be admitted "
            f"ahead of the trainer, fewer than {min(cfg.num_instances, num_units)} instances x "
            f"{unit_samples} samples per unit: "
            "instances will wait for trainer steps (raise max_lag or minibatch)"
        ]
    return []


MAX_UNITS_FOR_SEARCH = 20_000  # above this, one timeline costs ~0.2 s: use the first ordering only


def orderings(num_units: int) -> tuple[str, ...]:
    return ORDERINGS if num_units <= MAX_UNITS_FOR_SEARCH else ORDERINGS[:1]


def check_inputs(groups: Groups, cfg: PlannerConfig) -> None:
    cfg.validate()
    if len(groups) == 0:
        raise ValueError("no groups to plan")
    if groups.group_size != cfg.group_size:
        raise ValueError(f"groups hold {groups.group_size} samples, config says group_size={cfg.group_size}")


MIN_DEAL_ROWS = 4  # deal rows only when a unit then spans at most 1/4 of the length ranks
POLISH_WINDOW_ROWS = 4  # group swaps reach this many rows of K ranks (a unit spans K*c ranks)
RECUT_TRIGGER = 1e-3  # re-cut when full units leave the busiest instance this far above the mean (and group)
RECUT_BUSY_SLACK = 0.01  # ... and (unless split_units) it adds at most this share of predicted busy seconds


def skewed_units(groups: Groups, cfg: PlannerConfig, c: int) -> tuple[UnitTable, np.ndarray, np.ndarray]:
    """Padding + skewness: (units, instance per unit, mask of units other than the remainder).

    Groups ranked by predicted length are dealt in rows (`skewness.deal`: every instance the same
    mix of lengths), each instance's groups cut in rank order into units of `c` (length-homogeneous:
    a unit spans `K*c` consecutive ranks, at most 1/MIN_DEAL_ROWS of them; with fewer rows than that
    nothing is dealt); the ranks left over (fewer than a row of units) are cut globally, the
    remainder unit last, and placed longest first on the least-loaded instance. Then
    `skewness.polish` evens the predicted token loads by swapping groups of neighbouring ranks.

    Where these full units leave the busiest instance more than RECUT_TRIGGER above both the mean
    and the heaviest group (a unit alone above the mean load, or a group count per instance that is
    no multiple of `c`) and max_lag >= 1, smaller units are tried (`recut_units`); the best that
    lowers the busiest instance's predicted tokens, with the loads still within its largest unit, is
    kept. By default only a re-cut that keeps a blocking per-unit executor as fast on the cost
    model: the busiest instance's predicted seconds no higher, the total at most RECUT_BUSY_SLACK
    higher (such an executor pays a whole batch per extra unit: the `paper` simulator preset with
    the unit executor runs 4,110 tokens/s with full units, 2,623 with `split_units`). With
    `cfg.split_units` (executors that stream an instance's units through continuous batching) any
    re-cut, and with nothing dealt also rows dealt in units of the largest divisor `c' <= c` of the
    minibatch's groups that gives MIN_DEAL_ROWS rows: every instance the same mix of lengths again,
    each unit within 1/MIN_DEAL_ROWS of the ranks (benchmarks/plan_balance.py). With max_lag 0 units
    stay full: only units of `c*G` samples, dividing the minibatch, fill every synchronous admission.
    """
    k, n_groups = cfg.num_instances, len(groups)
    order = length_order(groups.mean, cfg.seed)
    rank = np.empty(n_groups, dtype=np.int64)
    rank[order] = np.arange(n_groups)
    inst_of_rank, full = deal(groups.mean[order], k, c)
    if full < MIN_DEAL_ROWS * k * c:  # too few rows: dealt units would span too wide a length range
        inst_of_rank, full = inst_of_rank[:0], 0
    kept, loads = _full_units(groups, cfg, c, order, rank, inst_of_rank, full)
    floor = max(float(loads.mean()), float(groups.mean.max()))  # no split lowers the heaviest group
    if k < 2 or cfg.max_lag < 1 or loads.max() <= floor * (1 + RECUT_TRIGGER):
        return kept
    layouts = [recut_units(groups, cfg, c, order, rank, inst_of_rank, full)]
    if cfg.split_units and full == 0:  # also rows of smaller units: the same mix of lengths everywhere
        per_mb = cfg.minibatch // cfg.group_size
        small = max((d for d in divisors(per_mb) if d <= c and n_groups >= MIN_DEAL_ROWS * k * d), default=1)
        inst_small, full_small = deal(groups.mean[order], k, small)
        if full_small:
            layouts.append(recut_units(groups, cfg, small, order, rank, inst_small, full_small))
    best = _best_recut(groups, cfg, layouts, kept, float(loads.max()))
    return kept if best is None else best


def _full_units(
    groups: Groups, cfg: PlannerConfig, c: int, order: np.ndarray, rank: np.ndarray,
    inst_of_rank: np.ndarray, full: int,
) -> tuple[tuple[UnitTable, np.ndarray, np.ndarray], np.ndarray]:
    """The layout of full units of `c` groups, polished, and each instance's predicted tokens."""
    k = cfg.num_instances
    by_instance = np.argsort(inst_of_rank, kind="stable")  # each instance's ranks, ascending
    rest_order, rest_offsets = cut_units(order[full:], c)
    group_order = np.concatenate([order[by_instance], rest_order])
    offsets = np.r_[np.arange(0, full, c), full + rest_offsets].astype(np.int64)
    units = unit_table(groups, cfg, group_order, offsets, c)
    tokens = np.add.reduceat(groups.mean[group_order], offsets[:-1]) if offsets.size > 1 else np.zeros(0)
    m_full = full // c
    assign = np.empty(tokens.size, dtype=np.int64)
    assign[:m_full] = np.arange(m_full) // max(1, m_full // k)
    movable = np.ones(tokens.size, dtype=bool)
    if units.last_unit >= 0:
        movable[units.last_unit] = False
    rest = np.flatnonzero(movable[m_full:]) + m_full
    if m_full == 0:
        assign[rest] = balance(tokens[rest], k)
    else:
        assign[rest] = lpt(tokens[rest], k, np.bincount(assign[:m_full], tokens[:m_full], minlength=k))
    if units.last_unit >= 0:
        loads = np.bincount(assign[movable], weights=tokens[movable], minlength=k)
        assign[units.last_unit] = int(np.argmin(loads))
    inst_at = np.repeat(assign, np.diff(offsets))
    swapped = polish(groups.mean, group_order, inst_at, rank, k, window=POLISH_WINDOW_ROWS * k)
    kept = unit_table(groups, cfg, swapped, offsets, c), assign, movable
    return kept, np.bincount(inst_at, weights=groups.mean[swapped], minlength=k)


def _best_recut(
    groups: Groups, cfg: PlannerConfig, layouts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    kept: tuple[UnitTable, np.ndarray, np.ndarray], kept_max: float,
) -> tuple[UnitTable, np.ndarray, np.ndarray] | None:
    """The re-cut layout with the lowest busiest-instance tokens below `kept_max`, loads within its
    largest unit, and (without `split_units`) no busier for a blocking per-unit executor; else None."""
    k = cfg.num_instances
    busy = np.bincount(kept[1], weights=kept[0].seconds, minlength=k)
    best: tuple[UnitTable, np.ndarray, np.ndarray] | None = None
    best_max = kept_max * (1 - 1e-9)
    for r_order, r_offsets, r_assign in layouts:
        r_loads = np.bincount(np.repeat(r_assign, np.diff(r_offsets)), groups.mean[r_order], minlength=k)
        r_largest = float(np.add.reduceat(groups.mean[r_order], r_offsets[:-1]).max())
        if r_loads.max() >= best_max or r_loads.max() - r_loads.min() > r_largest * (1 + 1e-9):
            continue
        seconds = unit_costs(groups, r_order, r_offsets, cfg)
        r_busy = np.bincount(r_assign, weights=seconds, minlength=k)
        if not cfg.split_units and (
            r_busy.max() > busy.max() * (1 + 1e-9) or r_busy.sum() > busy.sum() * (1 + RECUT_BUSY_SLACK)
        ):
            continue  # a blocking per-unit executor would be busier
        r_units = UnitTable(r_order, r_offsets, seconds, np.diff(r_offsets) * cfg.group_size, -1)
        best, best_max = (r_units, r_assign, np.ones(r_assign.size, dtype=bool)), float(r_loads.max())
    return best


def recut_units(
    groups: Groups,
    cfg: PlannerConfig,
    c: int,
    order: np.ndarray,
    rank: np.ndarray,
    inst_of_rank: np.ndarray,
    full: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`skewed_units`' ranks in units of at most `c` groups balanced below unit granularity, then
    polished; no remainder unit: (group order, unit offsets, instance per unit).

    The first `full` ranks dealt by `inst_of_rank` stay in their units of `c`; the ranks left over
    (the shortest groups, fewer than a row of units) are poured on top of them in one band per
    instance (`skewness.bands`), each band cut into as few and as even units as fit `c`. With
    nothing dealt, all ranks are cut into even units of consecutive ranks, as many as full units
    rounded up to a multiple of K (so every instance can run as many), placed by `balance`.
    """
    k, n_groups = cfg.num_instances, len(groups)
    if full:
        by_instance = np.argsort(inst_of_rank, kind="stable")
        m_full = full // c
        rest = order[full:]
        dealt_loads = np.bincount(inst_of_rank, weights=groups.mean[order[:full]], minlength=k)
        lo, hi, band_inst = bands(groups.mean[rest], dealt_loads)
        starts, band = even_cuts(lo, hi, c)
        offsets = np.r_[np.arange(0, full, c), full + starts, n_groups].astype(np.int64)
        assign = np.r_[np.arange(m_full) // max(1, m_full // k), band_inst[band]].astype(np.int64)
        group_order = np.concatenate([order[by_instance], rest])
    else:
        full_units = -(-n_groups // c)
        count = min(n_groups, -(-full_units // k) * k)
        offsets = ((np.arange(count + 1) * n_groups) // count).astype(np.int64)
        group_order = order
        assign = balance(np.add.reduceat(groups.mean[order], offsets[:-1]), k)
    inst_at = np.repeat(assign, np.diff(offsets))
    swapped = polish(groups.mean, group_order, inst_at, rank, k, window=POLISH_WINDOW_ROWS * k)
    return swapped, offsets, assign


def plan(groups: Groups, cfg: PlannerConfig) -> RolloutPlan:
    """Plan every sample of `groups` on `cfg.num_instances` instances (padding, skewness, sorting)."""
    t0 = time.perf_counter()
    c0 = time.process_time()
    check_inputs(groups, cfg)
    # padding: length-homogeneous units, cut from the longest end (remainder = shortest, runs last)
    c = unit_size(groups, cfg)
    units, assign, movable = skewed_units(groups, cfg, c)
    # sorting: candidate orders (remainder unit last), each timed under the lag rule on the
    # predicted costs; keep the one whose last trainer step ends first
    mine = [np.flatnonzero((assign == k) & movable) for k in range(cfg.num_instances)]
    candidates: dict[str, list[list[int]]] = {}
    for name in orderings(units.seconds.size):
        orders = instance_orders(name, [units.seconds[m] for m in mine], [units.sizes[m] for m in mine])
        instance_order = []
        for k in range(cfg.num_instances):
            order = mine[k][orders[k]].tolist()
            if units.last_unit >= 0 and assign[units.last_unit] == k:
                order.append(units.last_unit)
            instance_order.append(order)
        candidates[name] = instance_order
    scores = {}
    timelines: dict[str, Timeline] = {}
    if len(candidates) > 1:
        for name, instance_order in candidates.items():
            tl = timelines[name] = plan_timeline(instance_order, units, cfg)
            scores[name] = (float(tl.step_end[-1]) if tl.step_end.size else 0.0, float(tl.finish.max()))
        best = min(candidates, key=lambda n: (*scores[n], list(candidates).index(n)))
    else:
        best = next(iter(candidates))
    instance_order = candidates[best]
    plan_ = assemble(groups, cfg, units, assign, instance_order, "asp", t0, timelines.get(best))
    plan_.summary["ordering"] = best
    plan_.summary["ordering_scores"] = {n: round(v[0], 3) for n, v in scores.items()}
    plan_.summary["plan_seconds"] = round(time.perf_counter() - t0, 4)
    plan_.summary["plan_cpu_seconds"] = round(time.process_time() - c0, 4)
    return plan_
