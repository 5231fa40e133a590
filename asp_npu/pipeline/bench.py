"""`asp-npu bench real`: run modes one after the other with real engines and trainer, side by side.

Every mode gets the same config (model, prompts, instances, trainer, minibatch, iterations) and the
same seeds; only `rl_config.mode` changes. The warm start (if configured) runs once and every mode
starts from the same warm-started weights. Within each seed the mode order rotates, so slow drift
of a shared machine does not always hit the same mode. Each run keeps its full run directory
(`<out-dir>/<mode>_s<seed>/`, with report.png); the table and `--json` give per-mode medians.
With partial rollout (`--partial-rollout`) each asynchronous disaggregated mode also runs with
`rl_config.partial_rollout=true`, right after the same mode without it, as the mode `<mode>+partial`.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from asp_npu.config import Config, with_changes
from asp_npu.pipeline.efficiency import describe
from asp_npu.pipeline.preflight import preflight

BASELINE = "mindspeed-sync"
PARTIAL = "+partial"


def partial_allowed(mode: str) -> bool:
    """`Mode.allows_partial` as the real pipeline runs the mode (an unknown name: False)."""
    from asp_npu.core.modes import TABLE

    m = TABLE.get(mode)
    return m is not None and m.allows_partial()


def with_partial(modes: list[str]) -> list[str]:
    """Each mode, followed by `<mode>+partial` where partial rollout applies (side by side)."""
    return [n for m in modes for n in ([m, m + PARTIAL] if partial_allowed(m) else [m])]


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def _median_known(xs: list[float | None]) -> float | None:
    """The median of the values that were measured (None where none was)."""
    known = [x for x in xs if x is not None]
    return _median(known) if known else None


def _spread(xs: list[float]) -> float:
    return float(statistics.pstdev(xs)) if len(xs) > 1 else 0.0


def aggregate(runs: dict[str, list[dict[str, Any]]], steps_tail: float = 0.25) -> dict[str, Any]:
    """Per mode: medians over seeds (`x_limit` and `mfu` where measured), the mean reward curve, and the
    seed-to-seed reward spread."""
    out: dict[str, Any] = {}
    for mode, rs in runs.items():
        curves = [r["reward_curve"] for r in rs if r["reward_curve"]]
        n = min((len(c) for c in curves), default=0)
        mean_curve = [sum(c[i] for c in curves) / len(curves) for i in range(n)]
        finals = [r["final_reward"] for r in rs]
        hist: dict[str, int] = {}
        for r in rs:
            for k, n in r.get("token_lag_hist", {}).items():
                hist[k] = hist.get(k, 0) + n
        out[mode] = {
            "partial_rollout": bool(rs and rs[0].get("partial_rollout")),
            "lag_newest_max": max((r.get("lag_newest_max", r["lag_max"]) for r in rs), default=0),
            "token_lag_max": max((r.get("token_lag_max", r["lag_max"]) for r in rs), default=0),
            "max_token_lag": rs[0].get("max_token_lag", rs[0]["max_lag"]) if rs else 0,
            "token_lag_hist": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
            "throughput_tokens_per_s": _median([r["throughput_tokens_per_s"] for r in rs]),
            "iteration_time_mean_s": _median([r["iteration_time_mean_s"] for r in rs]),
            "step_time_mean_s": _median([r["step_time_mean_s"] for r in rs]),
            "final_reward": sum(finals) / len(finals) if finals else 0.0,
            "final_reward_spread": _spread(finals),
            "reward_curve": mean_curve,
            "lag_max": max((r["lag_max"] for r in rs), default=0),
            "max_lag": rs[0]["max_lag"] if rs else 0,
            "bubbles": {k: _median([r["bubbles"][k] for r in rs]) for k in rs[0]["bubbles"]} if rs else {},
            "x_limit": _median_known([(r.get("against_limit") or {}).get("x_limit") for r in rs]),
            "mfu": _median_known([(r.get("against_limit") or {}).get("mfu") for r in rs]),
            "trainer_idle_ratio": _median([r["trainer_idle_ratio"] for r in rs]),
            "rollouter_idle_ratio": _median([r["rollouter_idle_ratio"] for r in rs]),
            "samples": rs[0]["samples"] if rs else 0,
            "per_seed": [{**{k: r[k] for k in ("seed", "throughput_tokens_per_s", "iteration_time_mean_s",
                                               "final_reward", "lag_max", "run_dir")},
                          "x_limit": (r.get("against_limit") or {}).get("x_limit"),
                          "mfu": (r.get("against_limit") or {}).get("mfu")} for r in rs],
        }
    base = out.get(BASELINE)
    for mode, row in out.items():
        if base and base["throughput_tokens_per_s"] > 0:
            ratio = row["throughput_tokens_per_s"] / base["throughput_tokens_per_s"]
            row["speedup_vs_mindspeed_sync"] = ratio
        if base is not None and mode != BASELINE:
            gap = abs(row["final_reward"] - base["final_reward"])
            row["reward_gap_vs_sync"] = gap
            row["reward_within_spread"] = gap <= max(row["final_reward_spread"], base["final_reward_spread"])
    return out


def table(agg: dict[str, Any]) -> str:
    lines = ["| mode | tokens/s (median) | vs mindspeed-sync | iteration s | x limit | MFU | "
             "final reward (± seeds) | lag max / bound (partial rollout: newest token) | trainer idle | "
             "rollouter idle |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, r in agg.items():
        sp = r.get("speedup_vs_mindspeed_sync")
        lines.append(
            f"| {mode} | {r['throughput_tokens_per_s']:,.0f} | {f'{sp:.2f}x' if sp else '-'} | "
            f"{r['iteration_time_mean_s']:.2f} | {_cell(r.get('x_limit'), '.2f', 'x')} | "
            f"{_cell(r.get('mfu'), '.1%')} | {r['final_reward']:.3f} ± {r['final_reward_spread']:.3f} | "
            f"{r['lag_newest_max'] if r.get('partial_rollout') else r['lag_max']} / {r['max_lag']} | "
            f"{r['trainer_idle_ratio']:.2f} | "
            f"{r['rollouter_idle_ratio']:.2f} |"
        )
    return "\n".join(lines)


def _cell(v: float | None, fmt: str, unit: str = "") -> str:
    return "-" if v is None else f"{format(v, fmt)}{unit}"


def partial_table(agg: dict[str, Any]) -> str:
    """Partial rollout off and on, per mode: throughput, lags against their bounds, token-lag histogram."""
    lines = ["| mode | partial rollout | tokens/s | change | iteration s | lag newest max / max_lag | "
             "token lag max / max_token_lag | tokens by lag |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for mode, r in agg.items():
        off = agg.get(mode.removesuffix(PARTIAL)) if mode.endswith(PARTIAL) else None
        change = (f"{r['throughput_tokens_per_s'] / off['throughput_tokens_per_s'] - 1:+.1%}"
                  if off and off["throughput_tokens_per_s"] > 0 else "-")
        total = sum(r["token_lag_hist"].values()) or 1
        hist = ", ".join(f"{k}: {n / total:.1%}" for k, n in r["token_lag_hist"].items())
        lines.append(f"| {mode.removesuffix(PARTIAL)} | {'on' if r['partial_rollout'] else 'off'} | "
                     f"{r['throughput_tokens_per_s']:,.0f} | {change} | {r['iteration_time_mean_s']:.2f} | "
                     f"{r['lag_newest_max']} / {r['max_lag']} | "
                     f"{r['token_lag_max']} / {r['max_token_lag']} | {hist} |")
    return "\n".join(lines)


def _mode_config(base: Config, name: str, seed: int, out_dir: Path) -> Config:
    return with_changes(base, {"rl_config.mode": name.removesuffix(PARTIAL),
                               "rl_config.partial_rollout": name.endswith(PARTIAL), "data.seed": seed,
                               "trainer.run_dir": str(out_dir / f"{name}_s{seed}"),
                               "model.warm_start_steps": 0})


def run_bench(base: Config, modes: list[str], seeds: list[int], out_dir: Path, json_path: str | None = None,
              config_path: str | None = None,
              overrides: list[str] | None = None,
              overwrite: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Every mode for every seed (the order rotating per seed), after checking every mode's config.

    With `json_path`, the results so far are rewritten after every run, so a later failure keeps what
    was measured. Returns mode -> one run summary per seed.
    """
    from asp_npu.io import check_writable
    from asp_npu.pipeline.train import check_run_dir

    kind = "cpu"
    for m in modes:  # every mode's config and run directory is checked before anything starts
        kind = preflight(_mode_config(base, m, seeds[0], out_dir))
        for seed in seeds:
            check_run_dir(_mode_config(base, m, seed, out_dir), overwrite)
    if json_path:
        check_writable(json_path)
    made = not out_dir.exists()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        return _run_seeds(base, modes, seeds, out_dir, kind, json_path, config_path, overrides, overwrite)
    except BaseException:
        if made:  # a failed or interrupted bench leaves no empty --out-dir behind (runs roll back)
            try:
                out_dir.rmdir()
            except OSError:
                pass  # it holds what finished (runs, the warm start): kept
        raise


def _run_seeds(base: Config, modes: list[str], seeds: list[int], out_dir: Path, kind: str,
               json_path: str | None, config_path: str | None, overrides: list[str] | None,
               overwrite: bool) -> dict[str, list[dict[str, Any]]]:
    from asp_npu.pipeline.train import prepare_model, train

    prepare_model(base)
    if base.model.warm_start_steps > 0:
        from asp_npu.trainer import sft

        ws = out_dir / "warm_start"
        t0 = time.time()
        sft.warm_start(base, out_dir=str(ws), steps=base.model.warm_start_steps)
        print(f"warm start: {base.model.warm_start_steps} SFT steps in {time.time() - t0:.0f}s -> {ws}",
              file=sys.stderr)
        base = with_changes(base, {"model.path": str(ws)})  # every mode starts from the warm start
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for k, seed in enumerate(seeds):
        order = modes[k % len(modes):] + modes[: k % len(modes)]
        for mode in order:
            cfg = _mode_config(base, mode, seed, out_dir)
            t0 = time.time()
            summary = train(cfg, kind, console=True, label=f"{mode} s{seed}", overwrite=overwrite)
            summary.update(seed=seed, run_dir=cfg.trainer.run_dir)
            runs[mode].append(summary)
            if json_path:  # after every run, so a later failure keeps what was measured
                _write_json(json_path, config_path, list(overrides or []), seeds, base, runs)
            print(f"[{mode} s{seed}] {summary['throughput_tokens_per_s']:,.0f} tokens/s, "
                  f"iteration {summary['iteration_time_mean_s']:.2f}s, reward {summary['final_reward']:.3f}, "
                  f"{_lag_text(summary)} ({time.time() - t0:.0f}s with start-up)", file=sys.stderr)
            print(f"[{mode} s{seed}] {describe(summary.get('against_limit'))}", file=sys.stderr)
    return runs


def _lag_text(summary: dict[str, Any]) -> str:
    """The run's lag against its bounds: oldest token vs max_lag, or with partial rollout each
    group's newest token vs max_lag and every token vs max_token_lag."""
    if summary.get("partial_rollout"):
        return (f"lag newest max {summary['lag_newest_max']}/{summary['max_lag']}, token lag max "
                f"{summary['token_lag_max']}/{summary['max_token_lag']}")
    return f"lag max {summary['lag_max']}/{summary['max_lag']}, token lag max {summary['token_lag_max']}"


def _write_json(path: str, config: str | None, overrides: list[str], seeds: list[int], base: Config,
                runs: dict[str, list[dict[str, Any]]]) -> None:
    from asp_npu.io import atomic_write_json

    done = {m: rs for m, rs in runs.items() if rs}
    atomic_write_json(path, {"config": config, "overrides": overrides, "seeds": seeds,
                             "iterations": base.trainer.train_iters, "modes": aggregate(done)}, indent=2)


def load_results(path: str | Path) -> dict[str, Any]:
    """Read a `--json` file back (benchmarks and docs use it)."""
    return json.loads(Path(path).read_text())
