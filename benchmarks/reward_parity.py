"""asp-npu's verifiers against the reference implementations, case by case (docs/bench/rewards.md).

    python benchmarks/reward_parity.py --mindspeed-rl ~/src/MindSpeed-RL --verl ~/src/verl [--json out.json]

Loads MindSpeed-RL's `mindspeed_rl/models/rule_verifier.py` (with its math-eval toolkit) and verl's
`verl/utils/reward_score/{gsm8k,math_reward,math_dapo,math_verify}.py` from source checkouts, scores
every case of `tests/data/reward_cases.py` with them and with `asp_npu.data.verifiers`, and prints the
agreement per verifier and each disagreement. MindSpeed-RL's verifier needs `mathruler`, `word2number`,
`latex2sympy2`, `pylatexenc` and `torch` importable (put them on PYTHONPATH; nothing is installed).
Its logger and profiling decorator are replaced by inert stand-ins.

`acc`, `base_acc` and `math_17k_acc` compare answers with Qwen's `math_equal` / mathruler's
`grade_answer` there and with math-verify here: `--equal math-verify` patches those two into the
reference so that only extraction, format rules and score values are compared (the test fixture's
expectations); `--equal native` keeps MindSpeed-RL's own comparison (the figure in the bench file).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _package(name: str, path: Path) -> None:
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    sys.modules[name] = module


def _mindspeed(root: Path) -> types.ModuleType:
    """rule_verifier with its package stubbed down to what it imports."""
    _package("mindspeed_rl", root / "mindspeed_rl")
    _package("mindspeed_rl.models", root / "mindspeed_rl" / "models")
    _package("mindspeed_rl.utils", root / "mindspeed_rl" / "utils")
    loggers = types.ModuleType("mindspeed_rl.utils.loggers")

    class Loggers:
        def __init__(self, *a: Any, **k: Any) -> None:
            pass

        def __getattr__(self, name: str) -> Callable[..., None]:
            return lambda *a, **k: None

    loggers.Loggers = Loggers  # type: ignore[attr-defined]
    utils = types.ModuleType("mindspeed_rl.utils.utils")
    utils.mstx_timer_decorator = lambda fn: fn  # type: ignore[attr-defined]
    sys.modules.update({"mindspeed_rl.utils.loggers": loggers, "mindspeed_rl.utils.utils": utils})
    return importlib.import_module("mindspeed_rl.models.rule_verifier")


def _verl(root: Path) -> dict[str, types.ModuleType]:
    base = root / "verl" / "utils" / "reward_score"
    names = ("gsm8k", "math_reward", "math_dapo", "math_verify")
    return {n: _load(f"verl_ref_{n}", base / f"{n}.py") for n in names}


def references(ms: Path, verl: Path, equal: str) -> dict[str, Callable[[str, str], float]]:
    rv, vr = _mindspeed(ms), _verl(verl)
    if equal == "math-verify":
        from asp_npu.data.verifiers import answers_equal

        def math_equal(prediction: Any, reference: Any, timeout: bool = False) -> bool:
            return answers_equal(str(prediction), str(reference))

        def grade_answer(given: str | None, truth: str) -> bool:
            return given is not None and given != "None" and answers_equal(given, truth)

        rv.math_equal, rv.grade_answer = math_equal, grade_answer
    return {
        "acc": lambda s, a: rv.acc_worker(s, a),
        "format": lambda s, a: rv.format_reward([s])[0],
        "strict_format": lambda s, a: rv.strict_format_worker(s),
        "base_acc": lambda s, a: rv.base_model_accuracy_reward([s], [a])[0],
        "acc_for_dapo": lambda s, a: rv.accuracy_reward_for_dapo([s], [a])[0],
        "math_verify_reward": lambda s, a: rv.math_verify_accuracy_reward([s], [a])[0],
        "math_17k_acc": lambda s, a: rv.math_17k_accuracy_reward([s], [a])[0],
        "step": lambda s, a: rv.reasoning_steps_reward([s])[0],
        "gsm8k": lambda s, a: vr["gsm8k"].compute_score(s, a),
        "math": lambda s, a: vr["math_reward"].compute_score(s, a),
        "math_dapo": lambda s, a: vr["math_dapo"].compute_score(s, a)["score"],
        "math_verify": lambda s, a: vr["math_verify"].compute_score(s, a),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mindspeed-rl", type=Path, required=True, help="MindSpeed-RL source checkout")
    ap.add_argument("--verl", type=Path, required=True, help="verl source checkout")
    ap.add_argument("--equal", choices=("native", "math-verify"), default="native")
    ap.add_argument("--json", type=Path, help="write {case: {verifier: reference score}} here")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from asp_npu.data.verifiers import MINDSPEED_VERIFIERS, VERL_SCORES
    from tests.data.reward_cases import CASES

    ours = {**MINDSPEED_VERIFIERS, **VERL_SCORES}
    refs = references(args.mindspeed_rl, args.verl, args.equal)
    table: dict[str, dict[str, float]] = {}
    print(f"{'verifier':<20} agree / cases   (reference: {args.equal} equality)")
    for name, ref in refs.items():
        agree, diffs = 0, []
        for case, response, truth in CASES:
            want = float(ref(response, truth))
            got = float(ours[name](response, truth))
            table.setdefault(case, {})[name] = want
            agree += got == want
            if got != want:
                diffs.append(f"{case}: reference {want:g}, asp-npu {got:g}")
        print(f"{name:<20} {agree:>5} / {len(CASES)}" + "".join(f"\n    {d}" for d in diffs))
    if args.json:
        args.json.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
