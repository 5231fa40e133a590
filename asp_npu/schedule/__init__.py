"""The offline ASP planner: padding (grouping), skewness (balancing), sorting (ordering).

Public contract (stable; the simulator and the pipeline controller call exactly this)
=====================================================================================

Inputs -- `asp_npu.schedule.plan.Groups` (columnar, one row per GRPO group, all groups the same size)::

    Groups(prompt_ids: np.ndarray[str] (n_groups,),
           sample_idxs: np.ndarray[int] (n_groups, group_size),
           mean, q50, q90: np.ndarray[float] (n_groups,),      # predicted response tokens
           prompt_lens: np.ndarray[int] | None = None)
    Groups.from_estimates([(prompt_id, sample_idxs, LengthEstimate), ...])   # convenience

Planning -- `asp_npu.schedule.planner`::

    PlannerConfig(num_instances: int, minibatch: int,            # minibatch counts samples
                  group_size: int, max_num_seqs: int = 256,      # slots per instance
                  max_lag: int = 1, train_step_s: float = 0.0,   # trainer seconds per minibatch
                  cost: CostModel = CostModel(), seed: int = 0,
                  split_units: bool = False)                     # see "Skewness" below
    plan(groups: Groups, cfg: PlannerConfig) -> RolloutPlan      # deterministic for cfg.seed

Baselines with the same inputs -- `asp_npu.schedule.baselines`::

    fifo_plan(groups, cfg) -> RolloutPlan     # input order, same unit size, round-robin instances
    random_plan(groups, cfg) -> RolloutPlan   # shuffled by cfg.seed, same unit size, round-robin
    (unit ids of every plan are a valid global dispatch order: a dynamic executor such as the
     simulator's `async-fifo` mode may ignore the instance assignment and pull units by id)
    karmarkar_karp(weights, k), lpt_partition(weights, k) -> partition per item  # whole-group
     balance references (verl's get_seqlen_balanced_partitions method; sort + LPT)

Skewness balances predicted *tokens* per instance (`asp_npu.schedule.skewness`: rows of groups dealt
one per instance, units cut per instance, then group swaps between neighbouring lengths); the spread
of the instance loads is at most the largest unit, and equal to Karmarkar-Karp's on predictions
whenever every instance gets several units (benchmarks/plan_balance.py). Where full units are too
coarse for that (few units per instance), `planner.recut_units` cuts the same length ranks into
smaller, still length-homogeneous units -- by default only where a blocking per-unit executor stays
as fast on the cost model, with `split_units=True` wherever it evens the predicted tokens.

Cost model -- `asp_npu.schedule.cost.CostModel(a=0.0535, b=0.00035, c=0.0)`: one decode step of a
continuous batch takes `a + b*batch + c*kv_tokens` seconds (defaults: public Ascend figure, ANCHORS.md).
A unit runs as one batch (all its samples admitted together, the next unit of that instance when it
ends), so `unit_seconds = a*steps + b*sum(len) + c*sum(prompt_len*len + len^2/2)` with
`steps = max(longest, sum(len)/max_num_seqs)`; the planner uses each group's q90 as its longest.

Output -- `asp_npu.schedule.plan`::

    DispatchUnit(unit, instance, target_step, predicted_start, predicted_finish,
                 samples: list[PlannedSample(prompt_id, sample_idx, predicted_len)])
        .prompt_ids -> list[str]                      # the whole groups it holds, in order
    RolloutPlan
        .instances -> list[list[DispatchUnit]]       # per instance, ordered units (built lazily)
        .summary -> dict  # samples, groups, instances, units, unit_samples, predicted_makespan,
                          # lower_bound, makespan_ratio, plan_seconds, plan_cpu_seconds, minibatch,
                          # max_lag, trainer_steps, predicted_trainer_end, admission_wait_s,
                          # trainer_idle_s, max_planned_lag, mean_planned_lag, dispatch, ordering, seed,
                          # predicted_load_imbalance (seconds), predicted_token_imbalance,
                          # warnings (e.g. the lag bound leaves instances idle)
        columnar views: unit_instance, unit_start, unit_finish, unit_target_step, unit_offsets,
        unit_sizes, sample_unit, sample_group, sample_prompt_ids, sample_idx, sample_predicted_len,
        trainer_step_end, instance_units (list of unit-id arrays in execution order)
        .to_json() -> str, .write_json(path) (atomic and durable; refuses non-finite times),
        RolloutPlan.from_json(text), RolloutPlan.read_json(path)

    JSON schema "asp-plan/1": {"schema": "asp-plan/1", "instances": [{"instance": i, "units":
      [{"unit": u, "target_step": j, "predicted_start": s, "predicted_finish": f, "samples":
      [{"prompt_id": p, "sample_idx": k, "predicted_len": L}, ...]}, ...]}, ...],
      "trainer": {"step_end": [...]}, "summary": {...}}

Streaming dispatch -- `asp_npu.schedule.dispatch` (continuous-batching executors: the simulator's `stream`
executor and the pipeline controller; the plan's units above are for blocking per-unit executors)::

    d = StreamDispatcher(num_instances)
    d.add(group_ids, predicted_len)          # pending groups (one admission window) + predicted tokens
    j = d.choose(candidates, instance)       # index into the pending ids `instance` should start now
    d.done(group_id)                         # finished or cancelled

Multi-turn trajectories are planned as samples: their "length" is the predicted decode tokens over
all turns (mean, q50), and q90 also carries the predicted tool wait in decode steps
(`asp_npu.predict.trajectory`); the planner itself is unchanged.

Quality on actual lengths -- `asp_npu.schedule.quality.plan_quality(plan, actual_len, cfg) -> dict`
(token load balance, intra-unit spread, realised makespan / trainer end under the same timeline).

Lag bound, precisely (what "the plan respects max_lag" means; `asp_npu.schedule.timeline` models it,
`planner.check_lag_bound(plan, cfg)` checks a finished plan independently; same rule as the
pipeline's `asp_npu.core.staleness`):
- a unit of n samples planned to start at time t on its instance was admissible then:
  `admitted_before(t) + n <= (max_lag + version(t) + 1) * M` (AReaL's staleness rule; version(t) =
  planned trainer steps ended by t, weights refreshed at once). The planner delays a start until it
  holds (reported as `admission_wait_s`);
- the planned trainer takes completed samples earliest-deadline first (deadline = start version +
  max_lag), `min(M, N - consumed)` per step, each step lasting `train_step_s`, and waits rather than
  let a due straggler miss its step; hence every unit's `target_step - version <= max_lag`.
Units hold `c` groups where `c*G` divides M, and any smaller remainder unit is admitted last, so the
rule never deadlocks. Sorting tries a few orderings (aligned-smooth, aligned-descending, smooth) and
keeps the one whose planned last trainer step ends first.
"""
