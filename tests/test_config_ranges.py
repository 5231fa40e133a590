"""`validate` range-checks every numeric config field (NaN and inf included), all problems at once."""

from __future__ import annotations

import math
from dataclasses import fields, is_dataclass

import pytest

from asp_npu.config import DEFAULT_RANGE, NUMERIC_RANGES, Config, validate


def _numeric_keys(obj: object, prefix: str = "") -> list[tuple[str, type]]:
    out: list[tuple[str, type]] = []
    for f in fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        if is_dataclass(value):
            out += _numeric_keys(value, f"{prefix}{f.name}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append((f"{prefix}{f.name}", type(value)))
    return out


KEYS = _numeric_keys(Config())


def _set(cfg: Config, key: str, value: float) -> None:
    *path, name = key.split(".")
    obj = cfg
    for p in path:
        obj = getattr(obj, p)
    setattr(obj, name, value)


def test_defaults_are_valid() -> None:
    assert validate(Config()) == []


def test_table_names_real_fields() -> None:
    assert set(NUMERIC_RANGES) <= {k for k, _ in KEYS}


@pytest.mark.parametrize(("key", "kind"), KEYS, ids=[k for k, _ in KEYS])
def test_every_numeric_field_is_range_checked(key: str, kind: type) -> None:
    low, high, low_x, _ = NUMERIC_RANGES.get(key, DEFAULT_RANGE)
    bad: list[float] = [low - 1 if kind is int else (low if low_x else low - 0.5)]  # type: ignore[operator]
    if high is not None:
        bad.append(high + 1)
    if kind is float:
        bad += [math.nan, math.inf, -math.inf]
    for value in bad:
        cfg = Config()
        _set(cfg, key, kind(value) if kind is int else value)
        problems = validate(cfg)
        assert any(p.startswith(f"{key}:") for p in problems), (key, value, problems)


def test_every_problem_listed_at_once() -> None:
    cfg = Config()
    cfg.actor_config.lr = math.nan
    cfg.generate_config.sampling_config.temperature = -1.0
    cfg.generate_config.sampling_config.top_p = 5.0
    cfg.generate_config.kv_cache_gib = -1.0
    cfg.data.num_prompts = -1
    cfg.trainer.stall_timeout_s = -3.0
    cfg.trainer.logger = ["console", "mlflow"]
    keys = {p.split(":")[0] for p in validate(cfg)}
    assert {"actor_config.lr", "generate_config.sampling_config.temperature",
            "generate_config.sampling_config.top_p", "generate_config.kv_cache_gib", "data.num_prompts",
            "trainer.stall_timeout_s", "trainer.logger"} <= keys
