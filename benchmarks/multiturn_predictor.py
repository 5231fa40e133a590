"""Trajectory predictor quality on the multi-turn presets (issue 29): per-prompt Spearman of the
predicted total model tokens, turns and tool wait of epoch 3 from epochs 0-2, and of the planner's
q90 (tokens + tool wait in decode steps) against the per-prompt mean trajectory latency.

Usage: PYTHONPATH=. .venv/bin/python benchmarks/multiturn_predictor.py
"""

from __future__ import annotations

import numpy as np

from asp_npu.data.traces import MultiTurnParams, synth_multiturn
from asp_npu.predict.factory import make_predictor
from asp_npu.predict.trajectory import TrajectoryPredictor
from asp_npu.sim.preset import load_preset


def rank(a: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(a, kind="stable"), kind="stable")


def sp(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(rank(a), rank(b))[0, 1])


def main() -> None:
    for name in ("agentic", "agentic-bimodal"):
        pre = load_preset(name)
        step = pre.cost.decode_a + pre.cost.decode_b * pre.cluster.max_num_seqs
        tr = synth_multiturn(MultiTurnParams(**{"n": pre.workload.n_samples_per_prompt,
                                                **pre.workload.multi_turn}))
        t = tr.turns
        assert t is not None
        wait, cnt = t.per_row(t.tool_s), t.counts
        P = tr.prompt_names.size
        p = TrajectoryPredictor(make_predictor("history"), step_s=step)
        past = tr.epoch < 3
        p.observe_trajectories(tr.prompt_names[tr.prompt_code[past]], tr.epoch[past], tr.response_len[past],
                               cnt[past], wait[past], tr.prompt_len[past])
        cur = tr.epoch == 3
        est = p.predict_trajectories(tr.prompt_names, np.ones(P))
        code, n = tr.prompt_code[cur], pre.workload.n_samples_per_prompt
        truth = [np.bincount(code, weights=x[cur], minlength=P) / n for x in (tr.response_len, cnt, wait)]
        eff = p.predict_many(tr.prompt_names, np.ones(P))
        lat = truth[0] * step + truth[2]
        print(f"{name}: spearman tokens {sp(est.tokens.mean, truth[0]):.3f} "
              f"turns {sp(est.turns, truth[1]):.3f} tool wait {sp(est.wait_s, truth[2]):.3f}; "
              "planner q90 vs per-prompt mean latency "
              f"{sp(eff.q90, lat):.3f} (tokens-only q90: {sp(est.tokens.q90, lat):.3f})")


if __name__ == "__main__":
    main()
