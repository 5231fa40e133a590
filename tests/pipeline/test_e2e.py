"""End to end on CPU: real vLLM instances, megatron-core trainer, Ray queue -- trained through the CLI.

`asp-npu bench real --partial-rollout` runs `asp`, `asp+partial` and `mindspeed-sync` for 2 iterations
on a freshly built tiny model; the tests then check, from what the runs recorded: the lag invariant of
every trained sample, that every planned (prompt, sample) was generated and consumed exactly once, and
that the run directory holds a non-empty report, metrics, TensorBoard events, timeline, event log and
checkpoint. With partial rollout on (`test_lag_bounds_from_recorded_token_versions`, samples.jsonl's
per-token version change points): every group's newest tokens within `max_lag` of the step that consumed
it and every token within `max_token_lag`; with it off, the oldest-token rule. Answers of up to 96 tokens
and in-flight refreshes make sequences span weight versions. One bench serves every test here: a real
run is most of a test's cost. A resumed run (from the asp run's checkpoint, two instances) runs as its
own process watched from outside: it listens on loopback only and its console holds only progress.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from asp_npu.cli import main as cli_main
from asp_npu.core import run_dir as rd
from tests.pipeline.watch import WatchedRun, assert_console_has_only_progress, assert_loopback_only, watch

pytestmark = pytest.mark.slow

OVERRIDES = [
    "data.num_prompts=12", "rl_config.n_samples_per_prompt=4", "rl_config.mini_batch_size=8",
    "rl_config.global_batch_size=6", "rl_config.max_lag=1", "generate_config.max_num_seqs=8",
    "generate_config.sampling_config.max_tokens=24", "actor_config.micro_batch_size=8",
    "trainer.device=cpu", "trainer.stall_timeout_s=120", "model.warm_start_steps=0",
    # the weight_refresh path under test: auto (vLLM's weight-transfer engine, the default) | object-store
    f"generate_config.weight_transfer={os.environ.get('ASP_E2E_WEIGHT_TRANSFER', 'auto')}",
]


def bench_real(root: Path, flags: list[str], overrides: list[str]) -> tuple[dict, Path]:
    """`asp-npu bench real` of 2 iterations on a fresh tiny model under `root`: (its --json, runs folder)."""
    from asp_npu.data.init_model import build_model_dir

    model = build_model_dir(root / "tiny", "tiny", seed=0)
    out = root / "bench.json"
    rc = cli_main(["bench", "real", "--config", "configs/cpu_tiny.yaml", *flags, "--iterations", "2",
                   "--out-dir", str(root / "runs"), "--json", str(out), f"model.path={model}", *overrides])
    assert rc == 0
    return json.loads(out.read_text()), root / "runs"


# the bench's own: longer answers and a token bound above max_lag, for the partial-rollout run
BENCH = ["generate_config.num_instances=1", "generate_config.sampling_config.max_tokens=96",
         "rl_config.max_token_lag=2", "trainer.stall_timeout_s=180"]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return bench_real(tmp_path_factory.mktemp("e2e"), ["--modes", "asp,mindspeed-sync", "--partial-rollout"],
                      [*OVERRIDES, *BENCH])


def _planned(run: Path) -> list[tuple[str, int]]:
    out = []
    for plan in sorted((run / rd.PLANS).glob("*.json")):
        for inst in json.loads(plan.read_text())["instances"]:
            for unit in inst["units"]:
                out += [(s["prompt_id"], s["sample_idx"]) for s in unit["samples"]]
    return out


def _recorded(runs: Path, name: str) -> tuple[Path, dict, list[dict]]:
    """The bench's run `name`: its folder, summary.json and samples.jsonl rows."""
    run = runs / f"{name}_s1234"
    samples = [json.loads(line) for line in (run / rd.SAMPLES).read_text().splitlines()]
    return run, json.loads((run / rd.SUMMARY).read_text()), samples


@pytest.mark.parametrize("mode", ["asp", "mindspeed-sync"])
def test_run_invariants(bench, mode):
    results, runs = bench
    run, summary, samples = _recorded(runs, mode)
    # 2 iterations x 6 prompts x 4 samples, in 6 steps of 8
    assert summary["steps"] == 6 and len(samples) == 48
    # the colocated baseline generates on every core; ASP's instance and trainer own disjoint cores
    place, cores = summary["placement"], len(os.sched_getaffinity(0))
    if mode == "mindspeed-sync":
        assert summary["instances"] == cores and not place["disjoint"]
    elif cores >= 2:
        assert place["disjoint"] and summary["instances"] == 1
        assert not {c for cs in place["instance_cores"] for c in cs} & set(place["trainer_cores"])
    max_lag = summary["max_lag"]
    assert max_lag == (1 if mode == "asp" else 0)
    for s in samples:
        assert 0 <= s["step"] - s["policy_version"] <= max_lag, s
        assert s["weights_step"] <= s["weights_step_last"] <= s["trainer_step"]
    consumed = [(f"{s['prompt_id']}@{s['epoch']}", s["sample_idx"]) for s in samples]
    planned = _planned(run)
    assert len(consumed) == len(set(consumed)) and len(planned) == len(set(planned))
    assert sorted(consumed) == sorted(planned)
    for name in (rd.REPORT, rd.METRICS, rd.TIMELINE, rd.EVENTS, rd.QUEUE, rd.CONFIG, rd.SUMMARY):
        assert (run / name).stat().st_size > 0, name
    assert any(f.stat().st_size > 0 for f in (run / rd.TENSORBOARD).iterdir())
    from asp_npu.trainer.checkpoint import read_meta

    final = Path(read_meta(run / rd.CHECKPOINTS)["path"])  # the end-of-run checkpoint the pointer commits
    assert final.name == "iter_0000006" and (final / "pipeline.pkl").is_file()
    assert any((final / "dist").iterdir())
    trace = json.loads((run / rd.TIMELINE).read_text())
    assert len(trace["traceEvents"]) > 10
    b = summary["bubbles"]
    assert sum(b.values()) == pytest.approx(1.0, abs=1e-6)
    assert summary["bubble_coverage"] == pytest.approx(1.0, abs=1e-3)
    row = results["modes"][mode]
    assert row["lag_max"] <= max_lag and len(row["reward_curve"]) == 6
    assert row["throughput_tokens_per_s"] > 0 and row["iteration_time_mean_s"] > 0
    # against its limit, from the run's own costs: no schedule beats the bound (a little fit noise aside)
    lim = summary["against_limit"]
    assert lim["x_limit"] > 0 and row["x_limit"] == pytest.approx(lim["x_limit"]), lim
    assert lim["limit_iteration_s"] * lim["x_limit"] == pytest.approx(summary["iteration_time_mean_s"])
    assert lim["decode_sequences_fitted"] >= len(samples) and 0 < lim["mfu"] < 1 and 0 < row["mfu"] < 1
    final = [json.loads(line) for line in (run / rd.METRICS).read_text().splitlines()][-1]
    assert final["perf/x_limit"] == pytest.approx(lim["x_limit"])
    assert final["perf/mfu"] == pytest.approx(lim["mfu"])


@pytest.mark.parametrize("mode", ["asp", "mindspeed-sync"])
def test_the_bound_from_the_runs_own_costs_is_not_beaten(bench, mode):
    """The bound from the run's own costs is a lower bound (a little fit noise aside). It sat above the
    run (x limit 0.17) while the decode fit counted the engines' warm-up and refresh freezes."""
    _, runs = bench
    lim = json.loads((runs / f"{mode}_s1234" / rd.SUMMARY).read_text())["against_limit"]
    assert lim["x_limit"] >= 0.9, lim


@pytest.mark.parametrize("name", ["asp", "asp+partial"])
def test_lag_bounds_from_recorded_token_versions(bench, name):
    results, runs = bench
    run, summary, samples = _recorded(runs, name)
    partial = name.endswith("+partial")
    assert summary["partial_rollout"] is partial and len(samples) == 48
    max_lag, token_bound = summary["max_lag"], (2 if partial else 1)
    assert max_lag == 1 and summary["max_token_lag"] == token_bound
    newest: dict[tuple[str, int], int] = {}
    hist: dict[int, int] = {}
    for s in samples:
        ch = s["version_changes"]
        assert ch[0] == [0, s["policy_version"]] and ch[-1][1] == s["policy_version_newest"], s
        assert all(a[0] < b[0] and a[1] < b[1] for a, b in zip(ch, ch[1:], strict=False)), s
        assert ch[-1][0] < max(1, s["response_len"]), s
        for k, (lo, v) in enumerate(ch):  # every token within max_token_lag
            hi = ch[k + 1][0] if k + 1 < len(ch) else s["response_len"]
            assert 0 <= s["step"] - v <= token_bound, s
            hist[s["step"] - v] = hist.get(s["step"] - v, 0) + hi - lo
        g = (s["prompt_id"], s["epoch"])
        newest[g] = max(newest.get(g, -1), ch[-1][1])
        if not partial:  # the oldest-token rule: the first token within max_lag
            assert 0 <= s["step"] - s["policy_version"] <= max_lag, s
    steps = {(s["prompt_id"], s["epoch"]): s["step"] for s in samples}
    for g, v in newest.items():  # every group's newest tokens within max_lag
        assert 0 <= steps[g] - v <= max_lag, g
    assert {str(k): n for k, n in sorted(hist.items())} == summary["token_lag_hist"]
    assert sum(hist.values()) == summary["tokens"]
    consumed = [(f"{s['prompt_id']}@{s['epoch']}", s["sample_idx"]) for s in samples]
    assert len(consumed) == len(set(consumed)) and sorted(consumed) == sorted(_planned(run))
    metrics = [json.loads(line) for line in (run / rd.METRICS).read_text().splitlines()]
    per_step = [m for m in metrics if "rollout/token_lag_max" in m]
    assert len(per_step) == 6 and max(m["rollout/token_lag_max"] for m in per_step) <= token_bound
    assert max(m["async/lag_newest_max"] for m in per_step) <= max_lag
    row = results["modes"][name]
    assert row["partial_rollout"] is partial and row["token_lag_max"] <= token_bound


def test_report_redraws(bench, capsys):
    _, runs = bench
    png = runs / "asp_s1234" / rd.REPORT
    png.unlink()
    assert cli_main(["report", str(png.parent)]) == 0
    assert png.stat().st_size > 10_000 and str(png) in capsys.readouterr().out


@pytest.fixture(scope="module")
def resumed(bench) -> WatchedRun:
    """`actor_config.load` = the asp run's final checkpoint (step 6), one more iteration with two
    instances (the bench ran one; on 2 cores they share the cores with the trainer), as its own process
    watched from outside (`tests/pipeline/watch.py`): its listening sockets and its console."""
    _, runs = bench
    ckpt, out = runs / "asp_s1234" / rd.CHECKPOINTS, runs / "asp_resumed"
    return watch([sys.executable, "-m", "asp_npu.cli", "train", "--config", "configs/cpu_tiny.yaml",
                  f"model.path={runs.parent / 'tiny'}", f"actor_config.load={ckpt}", "trainer.train_iters=3",
                  "data.seed=1234", *OVERRIDES, "generate_config.num_instances=2",
                  "trainer.logger=[console,jsonl]", f"trainer.run_dir={out}"], out)


def test_resume_continues_from_the_checkpoint(bench, resumed):
    """Steps 7-9, generated with the restored weights, lag bound kept, the resumed-from checkpoint not
    cleared."""
    assert resumed.returncode == 0, resumed.console[-3000:]
    ckpt, out = bench[1] / "asp_s1234" / rd.CHECKPOINTS, resumed.run
    assert (ckpt / "latest.json").is_file()
    summary = json.loads((out / rd.SUMMARY).read_text())
    samples = [json.loads(line) for line in (out / rd.SAMPLES).read_text().splitlines()]
    assert summary["steps"] == 9 and len(samples) == 24 and summary["instances"] == 2
    assert {s["instance"] for s in samples} == {0, 1}
    for s in samples:
        assert 6 <= s["trainer_step"] <= 8 and 6 <= s["weights_step"] <= s["trainer_step"], s
        assert 0 <= s["step"] - s["policy_version"] <= 1, s
    steps = [json.loads(line)["step"] for line in (out / rd.METRICS).read_text().splitlines()]
    assert min(steps) == 7


def test_a_train_run_listens_on_loopback_only(resumed):
    """Single-machine mode: the run's process tree (Ray, vLLM instances, trainer ranks, the rendezvous
    store, gloo) never listens outside 127.0.0.0/8, with no loopback setting from `ci/test.sh`."""
    assert resumed.returncode == 0, resumed.console[-3000:]
    assert_loopback_only(resumed)


def test_a_train_runs_console_has_only_progress_and_each_actor_has_its_log(resumed):
    assert resumed.returncode == 0, resumed.console[-3000:]
    assert_console_has_only_progress(resumed, instances=2)
