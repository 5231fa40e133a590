"""Partial rollout end to end on CPU: `asp-npu bench real --partial-rollout --modes asp` on a tiny model.

Checks from what the runs recorded (samples.jsonl's per-token version change points), with partial
rollout on: every group's newest tokens within `max_lag` of the step that consumed it, every token
within `max_token_lag`, every planned (prompt, sample) consumed exactly once; and the same run with it
off keeps the oldest-token rule. Long answers (`ignore_eos`) and in-flight refreshes make sequences
span weight versions.
"""

from __future__ import annotations

import json

import pytest

from asp_npu.core import run_dir as rd
from tests.pipeline.test_e2e import _planned, bench_real

pytestmark = pytest.mark.slow

OVERRIDES = [
    "data.num_prompts=12", "rl_config.n_samples_per_prompt=4", "rl_config.mini_batch_size=8",
    "rl_config.global_batch_size=6", "rl_config.max_lag=1", "rl_config.max_token_lag=2",
    "generate_config.max_num_seqs=8", "generate_config.sampling_config.max_tokens=96",
    "actor_config.micro_batch_size=8", "trainer.device=cpu", "trainer.stall_timeout_s=180",
    "model.warm_start_steps=0", "generate_config.num_instances=1",
]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return bench_real(tmp_path_factory.mktemp("e2e_partial"), ["--modes", "asp", "--partial-rollout"],
                      OVERRIDES)


@pytest.mark.parametrize("name", ["asp", "asp+partial"])
def test_lag_bounds_from_recorded_token_versions(bench, name):
    results, runs = bench
    run = runs / f"{name}_s1234"
    summary = json.loads((run / rd.SUMMARY).read_text())
    samples = [json.loads(line) for line in (run / rd.SAMPLES).read_text().splitlines()]
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
