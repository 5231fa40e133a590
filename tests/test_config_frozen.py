"""The loaded config is validated once and frozen: a write after start raises; changes make copies."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields, is_dataclass

import pytest

from asp_npu.config import Config, ConfigError, Section, is_frozen, load_config, with_changes

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def _sections(obj: object) -> list[object]:
    out = [obj]
    for f in fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        if is_dataclass(value):
            out += _sections(value)
    return out


def test_every_section_can_be_frozen():
    assert all(isinstance(s, Section) for s in _sections(Config()))


def test_a_loaded_config_is_frozen_everywhere():
    cfg = load_config(str(ROOT / "configs" / "cpu_tiny.yaml"))
    assert all(is_frozen(s) for s in _sections(cfg))
    with pytest.raises(FrozenInstanceError, match="rl_config|RLConfig"):
        cfg.rl_config.max_lag = 3
    with pytest.raises(FrozenInstanceError):
        cfg.generate_config.sampling_config.top_p = 0.5


def test_with_changes_copies_and_keeps_the_original():
    cfg = load_config(str(ROOT / "configs" / "cpu_tiny.yaml"))
    new = with_changes(cfg, {"rl_config.max_lag": 3, "generate_config.sampling_config.top_p": 0.5})
    assert (new.rl_config.max_lag, new.generate_config.sampling_config.top_p) == (3, 0.5)
    assert cfg.rl_config.max_lag != 3 or cfg.generate_config.sampling_config.top_p != 0.5
    assert is_frozen(new) and is_frozen(new.rl_config)
    assert new.actor_config == cfg.actor_config


def test_with_changes_names_an_unknown_key():
    with pytest.raises(ConfigError, match="no_such_key"):
        with_changes(Config(), {"rl_config.no_such_key": 1})


def test_an_unvalidated_config_stays_writable():
    cfg = Config()
    cfg.rl_config.max_lag = 2
    assert not is_frozen(cfg)
