"""Reward and template settings: `config.validate` names every bad one (one line, exit 2 from the CLI,
before anything starts); the importer maps verl's reward keys; a good custom function passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from asp_npu.config import Config, RewardConfig, validate
from asp_npu.data.rewards import RewardSpec, reward_spec, split_custom
from asp_npu.deploy.import_config import translate_verl_reward

ROOT = Path(__file__).resolve().parents[2]
GOOD = ("import math\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")


def _problems(tmp_path: Path, **reward: object) -> list[str]:
    (tmp_path / "r.py").write_text(GOOD)
    cfg = Config()
    cfg.reward = RewardConfig(**reward)  # type: ignore[arg-type]
    return [p for p in validate(cfg) if p.startswith("reward.")]


def test_good_reward_settings_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    assert _problems(tmp_path) == []
    assert _problems(tmp_path, verifier_function=["acc", "format", "math_dapo"],
                     verifier_weight=[1, 0.5, 2]) == []
    assert _problems(tmp_path, custom_function="r.py:compute_score") == []
    assert _problems(tmp_path, custom_function="r.py") == []  # verl's default name: compute_score
    assert _problems(tmp_path, custom_function="r.py:math", verifier_function=["custom", "format"]) == []


@pytest.mark.parametrize("reward,problem", [
    ({"verifier_function": ["acc", "acc_v2"]}, "reward.verifier_function: unknown verifier 'acc_v2'"),
    ({"verifier_function": ["acc", "format"], "verifier_weight": [1.0]},
     "reward.verifier_weight: 1 weight(s) for 2 verifier(s)"),
    ({"verifier_weight": [1.0, 1.0]}, "reward.verifier_weight: 2 weight(s) for 1 verifier(s)"),
    ({"custom_function": "missing.py:fn"}, "reward.custom_function: 'missing.py' is not a file"),
    ({"custom_function": "r.py:score"}, "reward.custom_function: r.py defines no 'score'"),
    ({"verifier_function": ["custom"]}, "'custom' needs reward.custom_function"),
    ({"custom_function": "r.py", "verifier_function": ["acc"]}, "does not name 'custom'"),
    ({"verifier_timeout": 0.0}, "reward.verifier_timeout: must be > 0"),
])
def test_bad_reward_settings_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reward: dict,
                                      problem: str):
    monkeypatch.chdir(tmp_path)
    problems = _problems(tmp_path, **reward)
    assert len(problems) == 1 and problem in problems[0], problems


def test_custom_function_spec_and_reward_spec():
    assert split_custom("a/b/c.py:fn") == ("a/b/c.py", "fn")
    assert split_custom("c.py") == ("c.py", "compute_score")
    spec = reward_spec(RewardConfig(verifier_function=["acc", "format"], verifier_weight=[1, 0.5],
                                    verifier_timeout=3, verifier_parallel=4))
    assert spec == RewardSpec(("acc", "format"), (1.0, 0.5), "", 3.0, 4)
    assert spec.terms() == [("acc", 1.0), ("format", 0.5)]
    assert RewardSpec().terms() == [("auto", 1.0)]
    assert RewardSpec(custom_function="x.py").terms() == [("custom", 1.0)]


def test_verl_reward_keys_import():
    tr = translate_verl_reward({"custom_reward_function": {"path": "rw.py", "name": "my_fn"},
                                "reward_model": {"reward_manager": "dapo", "enable": False}})
    assert tr.out == {"reward": {"custom_function": "rw.py:my_fn"}}
    assert {"custom_reward_function.path", "custom_reward_function.name",
            "reward_model.reward_manager"} <= set(tr.mapped)
    tr = translate_verl_reward({"reward_model": {"enable": True, "reward_manager": "my_rm"}})
    assert [k for k, _ in tr.unmapped] == ["reward_model.reward_manager", "reward_model.enable"]


BAD_CONFIGS = {
    "unknown_verifier": ("reward:\n  verifier_function: [acc, accuracy]\n", "unknown verifier 'accuracy'"),
    "weights": ("reward:\n  verifier_function: [acc, format]\n  verifier_weight: [1.0]\n",
                "1 weight(s) for 2 verifier(s)"),
    "custom_path": ("reward:\n  custom_function: nowhere/rw.py:fn\n", "'nowhere/rw.py' is not a file"),
    "custom_name": ("reward:\n  custom_function: rw.py:fn\n", "rw.py defines no 'fn'"),
    "template": ("data:\n  prompt_type: qwen_r9\n", "unknown template 'qwen_r9'"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_train_refuses_bad_reward_config_in_one_line(tmp_path: Path, case: str):
    text, problem = BAD_CONFIGS[case]
    (tmp_path / "rw.py").write_text(GOOD)
    (tmp_path / "bad.yaml").write_text(text + "trainer:\n  run_dir: run\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "asp_npu.cli", "train", "--config", "bad.yaml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0] and "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing started, nothing written
