"""File helpers shared by every command: validated JSONL reading and atomic writes.

Atomic writes (temp file in the same folder + os.replace) guarantee that a failed command leaves
nothing half-written; JSONL errors name `file:line` and what is wrong.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from asp_npu.errors import UserError


def check_writable(path: str | os.PathLike[str]) -> Path:
    """Fail early (before any work) if `path` cannot be created or replaced."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise UserError(f"{p}: is a directory, expected a file path")
    if not parent.exists():
        raise UserError(f"{p}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UserError(f"{p}: not writable")
    return p


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write `data` to `path` so that readers see either the old file or the whole new one."""
    p = check_writable(path)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent if str(p.parent) else ".")
    try:
        with os.fdopen(fd, mode) as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual mode
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return p


def atomic_write_json(path: str | os.PathLike[str], obj: Any, indent: int | None = None) -> Path:
    return atomic_write(path, json.dumps(obj, indent=indent) + "\n")


def atomic_write_lines(path: str | os.PathLike[str], lines: Iterator[str] | list[str]) -> Path:
    return atomic_write(path, "".join(line if line.endswith("\n") else line + "\n" for line in lines))


FieldCheck = Callable[[Any], bool]


def read_jsonl(
    path: str | os.PathLike[str],
    fields: dict[str, tuple[type | tuple[type, ...], FieldCheck | None, str]] | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line_no, row)` for each non-blank line; raise UserError naming `file:line` on any defect.

    `fields` maps a required field to `(types, check, what_check_means)`, e.g.
    `{"response_len": (int, lambda v: v > 0, "must be > 0")}`.
    """
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: no such file")
    if p.is_dir():
        raise UserError(f"{p}: is a directory, expected a JSONL file")
    with open(p, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{p}:{line_no}: malformed JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise UserError(f"{p}:{line_no}: expected a JSON object, got {type(row).__name__}")
            for name, (types, check, what) in (fields or {}).items():
                if name not in row:
                    raise UserError(f"{p}:{line_no}: missing field '{name}'")
                value = row[name]
                if isinstance(value, bool) or not isinstance(value, types):
                    raise UserError(f"{p}:{line_no}: field '{name}' has wrong type ({value!r})")
                if check is not None and not check(value):
                    raise UserError(f"{p}:{line_no}: field '{name}' {what} (got {value!r})")
            yield line_no, row
