"""docs/configuration.md is generated from the config dataclasses and kept in sync with them."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from pathlib import Path

from asp_npu.config import Config
from asp_npu.deploy.reference import render

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def _keys(obj: object, prefix: str = "") -> list[str]:
    out: list[str] = []
    for f in fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        out += _keys(value, f"{prefix}{f.name}.") if is_dataclass(value) else [f"{prefix}{f.name}"]
    return out


def test_reference_names_every_key_once():
    rows = [line.split(" | ")[0] for line in render().splitlines() if line.startswith("| `")]
    for key in _keys(Config()):
        assert rows.count(f"| `{key}`") == 1, key


def test_docs_configuration_is_the_generated_reference():
    assert DOC.read_text() == render(), (
        "docs/configuration.md is out of date: asp-npu config-reference --out docs/configuration.md")
