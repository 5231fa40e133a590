"""The core layer: the pure rules the simulator and the Ray pipeline share (no Ray, torch or vLLM).

Public contract
===============

- `records`: `GroupKey(prompt_id, epoch)` (wire form `<prompt_id>@<epoch>`), `Unit` (whole groups from
  the planner to an instance or the simulator), the queue's messages `Arrival` and `Minibatch`.
- `modes`: the one mode table (`TABLE`, `mode_spec(name, admission)` for the real pipeline,
  `sim_mode(name, executor)` for the simulator); `MODES`, `REAL_MODES`, `COLOCATED_MODES`.
- `shape`: `RunShape.from_config(cfg, devices)` -- group size, minibatch, window, steps per window and
  per version, lag bound, instances, world sizes -- and `shape_problems(cfg)`, the divisibility check.
- `window`: `WindowPlanner.plan(...)` -- predict -> plan (ASP or FIFO) -> the window's units.
- `feed`: `make_feed(dispatch, ...)` -> `StaticFeed` | `PullFeed` | `StreamFeed`: which unit an instance
  asking for work gets next (`peek`, `take`, `refused`, `done`).
- `staleness` + `train_queue`: the bounded-lag admission rule and the `TrainQueue` (injected clock).
- `run_dir`: the run directory's layout and writers.

Drivers: `asp_npu.sim` (virtual clock) and `asp_npu.pipeline` (Ray actors, wall clock).
Allowed imports: the standard library, numpy, `asp_npu.errors`/`io`/`config`, `asp_npu.schedule`,
`asp_npu.predict` (tests/test_layers.py keeps it so).
"""
