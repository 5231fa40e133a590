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
