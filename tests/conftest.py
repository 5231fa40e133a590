"""Test-wide settings: every socket stays on loopback; torch-npu never autoloads."""

from __future__ import annotations

import os

from asp_npu.device import loopback_env

for _k, _v in {**loopback_env(), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "RAY_USAGE_STATS_ENABLED": "0",
               "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_k, _v)
