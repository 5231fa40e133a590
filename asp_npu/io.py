"""File helpers shared by every command: validated JSON/JSONL reading and durable atomic writes.

Atomic writes (a uniquely named temp file in the same folder, fsync'd, then os.replace, then the
folder fsync'd) guarantee that a failed or interrupted command leaves the old file or the whole new
one, never half of it, and that a completed write survives a power loss; `atomic_replace_dir` does the
same for a whole folder (a model), setting the old one aside until the new one is in place. Targets
that are not regular files (devices, FIFOs, sockets) are refused rather than replaced. Readers name
`file:line` and what is wrong: undecodable bytes, torn lines, wrong types, NaN/Infinity literals.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO

from asp_npu.errors import UserError

MODEL_MARKER = ".asp-npu-model"  # atomic_replace_dir marks the folders it writes (models) as ours


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
    payload = data.encode("utf-8") if isinstance(data, str) else data
    return atomic_write_with(path, lambda f: f.write(payload))


def atomic_write_with(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> Path:
    """`atomic_write` for a producer that writes into a binary file itself (`fig.savefig(f, ...)`,
    `torch.save(obj, f)`): it writes a uniquely named temp file beside `path`, which is fsync'd and
    renamed over `path`, or removed if anything fails."""
    p = check_writable(path)
    folder = p.parent if str(p.parent) else Path(".")
    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual mode
        _refuse_special(p)
        os.replace(tmp, p)
    except OSError as exc:
        _unlink(tmp)
        raise UserError(f"{p}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        _unlink(tmp)
        raise
    fsync_dir(folder)
    return p


def _refuse_special(p: Path) -> None:
    """A device, FIFO or socket at `p` is never replaced (os.replace would swap a regular file in)."""
    try:
        mode = os.lstat(p).st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode) or stat.S_ISDIR(mode)):
        raise UserError(f"{p}: not a regular file (a device, FIFO or socket is never replaced)")


def check_folder_writable(path: str | os.PathLike[str], parents: bool = False) -> Path:
    """Fail early (before minutes of work) if the folder `path` cannot be created or replaced
    (`parents`: missing folders above it will be made, so the nearest existing one must be writable)."""
    p = Path(path)
    if not str(path).strip():
        raise UserError("output folder is empty")
    parent = p.parent if str(p.parent) else Path(".")
    if parents:
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise UserError(f"{p}: {parent} is not a folder")
    if not parent.is_dir():
        raise UserError(f"{p}: folder {parent} does not exist")
    _refuse_special(p)
    try:
        probe = tempfile.mkdtemp(prefix=f".{p.name}.probe.", dir=parent)
    except OSError as exc:
        raise UserError(f"{p}: cannot write in {parent} ({exc.strerror})") from None
    os.rmdir(probe)
    if p.exists() and not os.access(p, os.W_OK):
        raise UserError(f"{p}: not writable")
    return p


def fsync_tree(folder: str | os.PathLike[str]) -> None:
    """fsync every file under `folder`, then every folder bottom-up (the entries themselves)."""
    for root, _dirs, files in os.walk(folder, topdown=False):
        for name in files:
            f = os.path.join(root, name)
            if os.path.islink(f):
                continue
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(root)


def atomic_replace_dir(path: str | os.PathLike[str], fill: Callable[[Path], object]) -> Path:
    """Make the folder `path` all at once: `fill(tmp)` writes it under a unique name beside `path`,
    everything is fsync'd, then it is swapped in. The previous folder is set aside (never deleted)
    until the new one is in place, and put back if the swap fails; any failure leaves the previous
    folder as it was and no temp behind. Readers see the old folder or the whole new one. The folder is
    marked (`MODEL_MARKER`) so a later `--out` recognises it as ours to replace."""
    out = Path(path)
    parent = out.parent if str(out.parent) else Path(".")
    _refuse_special(out)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=parent))
    except OSError as exc:
        raise UserError(f"{out}: cannot write in {parent} ({exc.strerror or exc})") from None
    aside: Path | None = None
    try:
        fill(tmp)
        (tmp / MODEL_MARKER).write_text("written by asp-npu: `--out`/`--force` may replace this folder\n")
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp creates 0700
        fsync_tree(tmp)
        aside = _swap_in(tmp, out, parent)
        fsync_dir(parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"{out}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if aside is not None:
        _remove(aside)
    return out


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def _swap_in(new: Path, out: Path, parent: Path) -> Path | None:
    """Put the complete folder `new` at `out`; returns where the previous `out` now is (to delete)."""
    if not os.path.lexists(out):
        os.rename(new, out)
        return None
    if _exchange(new, out):  # one atomic step: `out` is never missing
        return new
    hold = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=parent))
    os.rename(out, hold / "previous")
    try:
        os.rename(new, out)
    except BaseException:
        try:
            os.rename(hold / "previous", out)
        except OSError as exc:
            raise UserError(f"{out}: cannot write ({exc.strerror}); the previous folder is kept as "
                            f"{hold / 'previous'}") from None
        os.rmdir(hold)
        raise
    return hold


def _exchange(a: Path, b: Path) -> bool:
    """renameat2(RENAME_EXCHANGE) where the kernel and libc have it; False where they do not."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err))


def close_synced(f: IO[str] | IO[bytes]) -> None:
    """Close a log streamed row by row (metrics.jsonl, samples.jsonl), fsync'd first so a finished
    run's logs survive a power loss (each row was flushed as written; readers skip a torn last line)."""
    try:
        f.flush()
        os.fsync(f.fileno())
    except (OSError, ValueError):
        pass
    finally:
        f.close()


def _unlink(tmp: str) -> None:
    if not tmp:
        return
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


def check_streamed_jsonl(path: str | os.PathLike[str], what: str) -> None:
    """A log streamed row by row (metrics.jsonl): every line a JSON object, except a torn last line
    (no newline: a killed run). Anything else (a CSV, a renamed file) is the wrong kind of file."""
    p = check_readable(path, what)
    raw = p.read_bytes()
    lines = raw.split(b"\n")
    torn_ok = not raw.endswith(b"\n")
    for n, line in enumerate(lines, 1):
        if not line.strip() or (torn_ok and n == len(lines)):
            continue
        try:
            row = loads_strict(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise UserError(f"{p}: not UTF-8 text (line {n}), expected a {what}") from None
        except ValueError:
            raise UserError(f"{p}:{n}: not a JSON line: not a {what} (one JSON object per line)") from None
        if not isinstance(row, dict):
            raise UserError(f"{p}: row {n} is not a JSON object (expected a {what})")


MAX_YAML_BYTES = 1 << 20  # a config is a few KB; parsing a huge YAML (OmegaConf) would take minutes


def yaml_problem(path: str | os.PathLike[str], exc: BaseException) -> str:
    """`file:line:column: the parser's problem` for a YAML syntax error (a tab named as such)."""
    import yaml

    if not isinstance(exc, yaml.MarkedYAMLError):
        return f"{path}: cannot parse YAML ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    mark = exc.problem_mark or exc.context_mark
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = (exc.problem or exc.context or "malformed YAML").strip()
    if "'\\t'" in problem:
        problem = "a tab character (YAML indents with spaces only)"
    elif problem.startswith("found duplicate key"):
        problem = problem.replace("found duplicate key", "duplicate key")
    return f"{where}: {problem}"


def check_yaml_file(path: str | os.PathLike[str], what: str = "YAML file") -> Path:
    """A YAML file we may parse: readable, UTF-8, at most MAX_YAML_BYTES (checked before parsing)."""
    p = check_readable(path, what)
    size = p.stat().st_size
    if size > MAX_YAML_BYTES:
        raise UserError(f"{p}: {size / 2**20:.1f} MiB is too large for a {what} (limit "
                        f"{MAX_YAML_BYTES >> 20} MiB)")
    read_text_file(p, what)
    return p
