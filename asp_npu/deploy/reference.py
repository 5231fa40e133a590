"""The configuration reference (`docs/configuration.md`), generated from the config dataclasses.

Every key of `asp_npu.config.Config`: its type, default, allowed range or values, what it does (the
comment beside the field) and the MindSpeed-RL key `asp-npu import-config` maps onto it. Generated,
never edited by hand: `asp-npu config-reference --out docs/configuration.md`, and a test fails when the
file and the dataclasses disagree.
"""

from __future__ import annotations

import io
import tokenize
import typing
from dataclasses import MISSING, Field, fields, is_dataclass
from pathlib import Path
from typing import Any

from asp_npu import config as config_module
from asp_npu.config import DEFAULT_RANGE, NUMERIC_RANGES, Config, _range_text

HEADER = """# Configuration reference

Generated from the dataclasses in `asp_npu/config.py` by `asp-npu config-reference --out
docs/configuration.md` (a test keeps the two in sync). A YAML file or a `section.key=value`
override sets any key below; every other key keeps its default. `validate()` lists every problem of a
config in one line each before anything starts (exit code 2). The MindSpeed-RL column names the key
that `asp-npu import-config mindspeed-rl` maps onto ours (`-`: asp-npu's own key).
"""


def _comments() -> dict[int, tuple[str, bool, bool]]:
    """Comments of `config.py` by line: (text, alone on its line, a continuation: `#` then 3+ spaces)."""
    source = Path(config_module.__file__).read_text()
    out: dict[int, tuple[str, bool, bool]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            alone = not tok.line[: tok.start[1]].strip()
            out[tok.start[0]] = (tok.string.lstrip("#").strip(), alone, tok.string[1:].startswith("   "))
    return out


def _field_lines() -> dict[tuple[str, str], int]:
    """(dataclass name, field name) -> source line of the field in config.py."""
    import ast

    tree = ast.parse(Path(config_module.__file__).read_text())
    lines = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    lines[(node.name, stmt.target.id)] = stmt.lineno
    return lines


def _description(cls: type, name: str, comments: dict[int, tuple[str, bool, bool]],
                 lines: dict[tuple[str, str], int]) -> str:
    """The comments above a field (a block of its own), beside it, and continued under it."""
    line = lines.get((cls.__name__, name))
    if line is None:
        return ""
    above: list[str] = []
    up = line - 1
    while up in comments and comments[up][1] and not comments[up][2]:
        above.insert(0, comments[up][0])
        up -= 1
    parts = [*above, comments[line][0]] if line in comments and not comments[line][1] else above
    nxt = line + 1
    while nxt in comments and comments[nxt][1] and comments[nxt][2]:
        parts.append(comments[nxt][0])
        nxt += 1
    return " ".join(p.strip("- ") for p in parts if p).replace("|", "\\|")


def _mindspeed_names() -> dict[str, str]:
    """Our key -> the MindSpeed-RL key the importer maps onto it one to one."""
    from asp_npu.deploy import import_config as ic

    names = {ours: f"`{theirs}`" for theirs, ours in ic._DIRECT.items()}
    same = (("_RL_SAME_NAME", "rl_config"), ("_SAMPLING_SAME_NAME", "generate_config.sampling_config"),
            ("_GEN_SAME_NAME", "generate_config"))
    for attr, section in same:  # the same section path there (sampling_config included)
        for key in getattr(ic, attr, ()):
            names.setdefault(f"{section}.{key}", f"`{section}.{key}`")
    for f in fields(config_module.CriticConfig):  # `_critic_key`: the same names (DP: asp-npu's own)
        if f.name != "data_parallel_size":
            names[f"critic_config.{f.name}"] = f"`critic_config.{f.name}`"
    for key in ("gamma", "lam", "cliprange_value"):  # `_ppo_key`
        names[f"rl_config.{key}"] = f"`rl_config.{key}`"
    return names


def _choices() -> dict[str, tuple[str, ...]]:
    c = config_module
    table = {"trainer.logger": "LOGGERS", "rl_config.adv_estimator": "ADV_ESTIMATORS",
             "rl_config.kl_penalty": "KL_PENALTIES", "model.size": "MODEL_SIZES", "rl_config.mode": "MODES",
             "generate_config.weight_transfer": "WEIGHT_TRANSFERS"}
    return {key: tuple(getattr(c, name)) for key, name in table.items() if hasattr(c, name)}


def _default(f: Field[Any], value: Any) -> str:
    if f.default is MISSING and f.default_factory is MISSING:
        return "(required)"
    text = repr(value) if not isinstance(value, str) else f'"{value}"'
    return f"`{text}`"


def _allowed(key: str, value: Any, choices: dict[str, tuple[str, ...]]) -> str:
    if key in choices:
        return " \\| ".join(choices[key])
    if isinstance(value, bool):
        return "true \\| false"
    if isinstance(value, int | float):
        return _range_text(NUMERIC_RANGES.get(key, DEFAULT_RANGE))
    return ""


def _type_name(cls: type, name: str) -> str:
    hints = typing.get_type_hints(cls)
    t = hints.get(name)
    text = getattr(t, "__name__", None) or str(t).replace("typing.", "")
    return text.replace("|", "\\|")


def _section(obj: Any, prefix: str, ctx: dict[str, Any], out: list[str]) -> None:
    cls = type(obj)
    rows, nested = [], []
    for f in fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if is_dataclass(value):
            nested.append((value, key + "."))
            continue
        desc = _description(cls, f.name, ctx["comments"], ctx["lines"])
        rows.append(f"| `{key}` | {_type_name(cls, f.name)} | {_default(f, value)} | "
                    f"{_allowed(key, value, ctx['choices'])} | {ctx['mindspeed'].get(key, '-')} | {desc} |")
    if rows:
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        out += [f"## `{prefix.rstrip('.')}`", ""]
        if doc and not doc.startswith(cls.__name__ + "("):
            out += [doc, ""]
        out += ["| key | type | default | allowed | MindSpeed-RL | what it does |",
                "|---|---|---|---|---|---|", *rows, ""]
    for value, key in nested:
        _section(value, key, ctx, out)


def render() -> str:
    """The whole reference as Markdown (deterministic: the same dataclasses give the same bytes)."""
    ctx = {"comments": _comments(), "lines": _field_lines(), "mindspeed": _mindspeed_names(),
           "choices": _choices()}
    out = [HEADER]
    cfg = Config()
    for f in fields(cfg):
        _section(getattr(cfg, f.name), f.name + ".", ctx, out)
    return "\n".join(out).rstrip() + "\n"
