"""File helpers shared by every command: validated JSON/JSONL reading and durable atomic writes.

Atomic writes (a uniquely named temp file in the same folder, fsync'd, then os.replace, then the
folder fsync'd) guarantee that a failed or interrupted command leaves the old file or the whole new
one, never half of it, and that a completed write survives a power loss. Targets that are not
regular files (devices, FIFOs, sockets) are refused rather than replaced. Readers name `file:line`
and what is wrong: undecodable bytes, torn lines, wrong types, NaN/Infinity literals.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from asp_npu.errors import UserError


def check_writable(path: str | os.PathLike[str]) -> Path:
    """Fail early (before any work) if `path` cannot be created or replaced by a regular file."""
    p = Path(path)
    if not str(path).strip():
        raise UserError("output path is empty")
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise UserError(f"{p}: is a directory, expected a file path")
    if p.exists() and not p.is_file():
        raise UserError(f"{p}: not a regular file (a device, FIFO or socket is never replaced)")
    if not parent.exists():
        raise UserError(f"{p}: folder {parent} does not exist")
    if not parent.is_dir():
        raise UserError(f"{p}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UserError(f"{p}: not writable")
    return p


def check_readable(path: str | os.PathLike[str], what: str = "file") -> Path:
    """An existing regular file we may read (a FIFO or /dev/zero would block or never end)."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: no such file (expected a {what})")
    if p.is_dir():
        raise UserError(f"{p}: is a directory, expected a {what}")
    if not p.is_file():
        raise UserError(f"{p}: not a regular file, expected a {what}")
    if not os.access(p, os.R_OK):
        raise UserError(f"{p}: not readable")
    return p


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Make a rename in `folder` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write `data` to `path` durably so that readers see either the old file or the whole new one."""
    p = check_writable(path)
    folder = p.parent if str(p.parent) else Path(".")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual mode
        try:
            mode = os.lstat(p).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise UserError(f"{p}: not a regular file (a device, FIFO or socket is never replaced)")
        os.replace(tmp, p)
    except OSError as exc:
        _unlink(tmp)
        raise UserError(f"{p}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        _unlink(tmp)
        raise
    fsync_dir(folder)
    return p


def _unlink(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass


def finite_or_null(obj: Any) -> Any:
    """`obj` with every NaN/inf float replaced by None, so the JSON written is valid JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def json_text(obj: Any, indent: int | None = None) -> str:
    """Valid JSON (never a bare NaN/Infinity, which our readers and most others reject: null instead)."""
    try:
        return json.dumps(obj, indent=indent, allow_nan=False) + "\n"
    except ValueError:
        return json.dumps(finite_or_null(obj), indent=indent, allow_nan=False) + "\n"


def atomic_write_json(path: str | os.PathLike[str], obj: Any, indent: int | None = None) -> Path:
    return atomic_write(path, json_text(obj, indent))


def atomic_write_lines(path: str | os.PathLike[str], lines: Iterator[str] | list[str]) -> Path:
    return atomic_write(path, "".join(line if line.endswith("\n") else line + "\n" for line in lines))


def _no_constants(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def loads_strict(text: str | bytes) -> Any:
    """`json.loads` that refuses NaN/Infinity literals (they are not JSON)."""
    return json.loads(text, parse_constant=_no_constants)


def read_json_file(path: str | os.PathLike[str], what: str = "JSON file") -> Any:
    """Parse a whole JSON file; one UserError line for every way it can be wrong."""
    p = check_readable(path, what)
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{p}: not UTF-8 text (byte {exc.start})") from None
    try:
        return loads_strict(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{p}:{exc.lineno}: malformed JSON ({exc.msg}; column {exc.colno})") from None
    except ValueError as exc:
        raise UserError(f"{p}: malformed JSON ({exc})") from None


def read_text_file(path: str | os.PathLike[str], what: str = "file") -> str:
    """A whole UTF-8 text file; undecodable bytes -> one UserError line naming the line."""
    p = check_readable(path, what)
    raw = p.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise UserError(f"{p}:{line}: not UTF-8 text (byte {exc.start})") from None


FieldCheck = Callable[[Any], bool]


def read_jsonl(
    path: str | os.PathLike[str],
    fields: dict[str, tuple[type | tuple[type, ...], FieldCheck | None, str]] | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line_no, row)` for each non-blank line; raise UserError naming `file:line` on any defect.

    `fields` maps a required field to `(types, check, what_check_means)`, e.g.
    `{"response_len": (int, lambda v: v > 0, "must be > 0")}`.
    """
    p = check_readable(path, "JSONL file")
    with open(p, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"{p}:{line_no}: not UTF-8 text (byte {exc.start} of the line)") from None
            if not line.strip():
                continue
            try:
                row = loads_strict(line)
            except json.JSONDecodeError as exc:
                torn = " (torn line?)" if not raw.endswith(b"\n") else ""
                raise UserError(
                    f"{p}:{line_no}: malformed JSON ({exc.msg}; column {exc.colno}){torn}"
                ) from None
            except ValueError as exc:
                raise UserError(f"{p}:{line_no}: malformed JSON ({exc})") from None
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
