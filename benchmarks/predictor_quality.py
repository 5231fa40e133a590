"""Response-length predictor quality per epoch (epoch E predicted from epochs < E only).

Usage: .venv/bin/python benchmarks/predictor_quality.py [--prompts 4000] [--seeds 3] [--json]

Traces: the generator's defaults, with drift 0.1, and the bimodal and heavy-tail shapes built in
benchmarks/plan_quality.py (not from the generator). Median over seeds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plan_quality import traces  # noqa: E402

from asp_npu.predict.evaluate import evaluate  # noqa: E402

METRICS = ("spearman", "spearman_samples", "mae", "mape_group", "coverage_q90")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    acc: dict[tuple, list[dict]] = {}
    for s in range(a.seeds):
        for name, tr in traces(1000 + s, a.prompts).items():
            for predictor in ("history", "prompt-len", "oracle"):
                for epoch in (1, 2, 3):
                    acc.setdefault((name, predictor, epoch), []).append(evaluate(tr, epoch, predictor))
    rows = []
    for (name, predictor, epoch), res in acc.items():
        med = {m: round(float(np.median([r[m] for r in res])), 4) for m in METRICS}
        rows.append({"trace": name, "predictor": predictor, "epoch": epoch, "seeds": len(res), **med})
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"prompts={a.prompts} x 16 samples, median of {a.seeds} seeds")
    print("| trace | predictor | epoch | " + " | ".join(METRICS) + " |")
    print("|" + "---|" * (3 + len(METRICS)))
    for r in rows:
        print(
            f"| {r['trace']} | {r['predictor']} | {r['epoch']} | "
            + " | ".join(str(r[m]) for m in METRICS)
            + " |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
