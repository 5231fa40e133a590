"""Test-wide settings: every socket stays on loopback; torch-npu never autoloads."""

from __future__ import annotations

import os

from asp_npu.device import loopback_env

for _k, _v in {**loopback_env(), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "RAY_USAGE_STATS_ENABLED": "0",
               "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_k, _v)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """A freshly built tiny Qwen2 model + tokenizer (HF folder), built once per test session."""
    from asp_npu.data.init_model import build_model_dir

    return build_model_dir(tmp_path_factory.mktemp("models") / "tiny", size="tiny", seed=0)


# Seconds per test file, the longest ones (a CI run's `--durations`, summed by file; each a lower bound).
# `ci/test.sh` hands whole files to its two workers in collection order (`--dist loadfile
# --no-loadscope-reorder`), so the longest files start first and the short ones fill the end: xdist's
# own order (most tests first) left the few-test, real-engine files for last, one worker finishing alone.
# A file not listed counts 60 s when it has slow tests, else nothing; a stale figure only moves the order.
FILE_SECONDS = {
    "tests/pipeline/test_chaos.py": 590, "tests/weights/test_engine_link.py": 510,
    "tests/pipeline/test_e2e_multi_turn.py": 470, "tests/pipeline/test_resume.py": 460,
    "tests/pipeline/test_e2e.py": 410, "tests/pipeline/test_e2e_partial.py": 365,
    "tests/pipeline/test_e2e_dapo.py": 335, "tests/pipeline/test_multinode.py": 320,
    "tests/test_signals_commands.py": 210, "tests/test_bad_input_signals.py": 205,
    "tests/pipeline/test_loopback.py": 135, "tests/pipeline/test_e2e_ppo.py": 120,
    "tests/pipeline/test_e2e_moe.py": 115, "tests/pipeline/test_e2e_lora.py": 115,
    "tests/rollout/test_instance_ray.py": 90,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first (`FILE_SECONDS`), each file's tests in their own order."""
    files = [item.nodeid.split("::", 1)[0] for item in items]
    cost: dict[str, float] = {}
    for item, path in zip(items, files, strict=True):
        slow = 60.0 if item.get_closest_marker("slow") else 0.0
        cost[path] = max(cost.get(path, 0.0), FILE_SECONDS.get(path, slow))
    rank = {path: k for k, path in enumerate(dict.fromkeys(files))}
    key = {id(item): (-cost[path], rank[path]) for item, path in zip(items, files, strict=True)}
    items.sort(key=lambda item: key[id(item)])
