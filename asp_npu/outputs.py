"""The one rule for what a command may write: outputs never land on inputs or on another run's files.

Every command with an output calls `check_output` (a file) or `check_output_folder` (a model folder)
before any work, naming its inputs. Refused, with one line naming both paths:
- an output that is, contains or lies inside an input (`plan --out` equal to `--trace`, `sft --out`
  holding `model.path`);
- an output inside another run directory's own files (`report --out RUN/metrics.jsonl`, a checkpoint
  folder of another run), a run directory being a folder with our marker (`core.run_dir.MARKER`) or,
  for runs written before the marker, `config.yaml` beside `metrics.jsonl` or `checkpoints/`;
- a folder output that exists and is neither empty nor recognisably ours: a model folder we wrote
  (`io.MODEL_MARKER`, or only the files of an HF model folder) — a user's `models/` is never replaced.
Paths are compared after resolving symlinks and `..`, so another spelling of the same file is caught.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from asp_npu.core.run_dir import MARKER as RUN_MARKER
from asp_npu.core.run_dir import OWNED as RUN_FILES
from asp_npu.core.run_dir import PREVIOUS
from asp_npu.errors import UserError
from asp_npu.io import MODEL_MARKER, check_folder_writable, check_writable

Input = tuple[str, "str | os.PathLike[str] | None"]  # (what the user called it, the path)

# what init-model and save_hf_folder write: a folder holding only these is a model folder of ours
MODEL_FILES = frozenset({"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                         "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                         "vocab.json", "merges.txt", "added_tokens.json", MODEL_MARKER})


def resolved(path: str | os.PathLike[str]) -> Path:
    """`path` absolute, symlinks and `..` resolved as far as it exists."""
    return Path(os.path.expanduser(os.fspath(path))).resolve(strict=False)


def is_run_dir(folder: Path) -> bool:
    """A folder a run wrote: our marker, or (older runs) config.yaml beside metrics or checkpoints."""
    if (folder / RUN_MARKER).is_file():
        return True
    return (folder / "config.yaml").is_file() and ((folder / "metrics.jsonl").is_file()
                                                   or (folder / "checkpoints").is_dir())


def owning_run(path: str | os.PathLike[str]) -> tuple[Path, str] | None:
    """(run directory, its file name) when `path` is or lies inside one of a run directory's own files."""
    p = resolved(path)
    for above in p.parents:
        if is_run_dir(above):
            name = p.relative_to(above).parts[0]
            if name in RUN_FILES or name.startswith(PREVIOUS + "."):
                return above, name
            return None
    return None


def overlap_problem(flag: str, out: str | os.PathLike[str], inputs: Iterable[Input]) -> str | None:
    """Why `out` may not be written over `inputs` (None: it may)."""
    o = resolved(out)
    for what, given in inputs:
        if given is None or not str(given).strip():
            continue
        i = resolved(given)
        if o == i:
            return f"{flag} {out} is the input {what} {given}: it would be destroyed"
        if i in o.parents:
            return f"{flag} {out} lies inside the input {what} {given}"
        if o in i.parents:
            return f"{flag} {out} contains the input {what} {given}"
    return None


def _run_problem(flag: str, out: str | os.PathLike[str], own_run: str | os.PathLike[str] | None,
                 allowed: tuple[str, ...]) -> str | None:
    owner = owning_run(out)
    if owner is None:
        return None
    run, name = owner
    if own_run is not None and resolved(own_run) == run and name in allowed:
        return None
    return f"{flag} {out} is part of the run directory {run} ({name}): another run's files are never written"


def check_output(out: str | os.PathLike[str], inputs: Iterable[Input] = (), flag: str = "--out",
                 own_run: str | os.PathLike[str] | None = None, allowed: tuple[str, ...] = ()) -> Path:
    """A file output that may be written (UserError otherwise): writable, not an input, not inside
    one, not another run's file (`own_run`'s `allowed` names excepted: `report` writes report.png)."""
    p = check_writable(out)
    problem = overlap_problem(flag, out, inputs) or _run_problem(flag, out, own_run, allowed)
    if problem:
        raise UserError(problem)
    return p


def distinct_outputs(outputs: Iterable[tuple[str, str | os.PathLike[str] | None]]) -> None:
    """Two outputs of one command on the same path: the second would replace the first."""
    seen: dict[Path, str] = {}
    for flag, path in outputs:
        if path is None:
            continue
        key = resolved(path)
        if key in seen:
            raise UserError(f"{flag} {path} is also {seen[key]}: one would replace the other")
        seen[key] = f"{flag} {path}"


def foreign_entry(folder: Path) -> str | None:
    """The first entry that makes an existing folder not ours to replace (None: empty or ours)."""
    if not folder.is_dir() or (folder / MODEL_MARKER).is_file():
        return None
    for entry in sorted(os.listdir(folder)):
        if entry not in MODEL_FILES or not (folder / entry).is_file():
            return entry
    return None


def check_output_folder(out: str | os.PathLike[str], inputs: Iterable[Input] = (), flag: str = "--out",
                        parents: bool = False) -> Path:
    """A model-folder output that may be (re)written: creatable, not overlapping an input or a run's
    files, and absent, empty or a model folder we wrote (anything else of the user's is refused)."""
    p = check_folder_writable(out, parents=parents)
    problem = overlap_problem(flag, out, inputs) or _run_problem(flag, out, None, ())
    if problem:
        raise UserError(problem)
    if is_run_dir(p):
        raise UserError(f"{flag} {out} is a run directory: a model folder never replaces a run")
    entry = foreign_entry(p)
    if entry is not None:
        raise UserError(f"{flag} {out} already exists and holds '{entry}', which is not part of a model "
                        "folder asp-npu wrote: choose a new or empty folder")
    return p


def checkpoint_problem(save: str | os.PathLike[str], run_dir: str | os.PathLike[str],
                       load: str | os.PathLike[str] | None, overwrite: bool) -> str | None:
    """`actor_config.save` outside the run directory: it may not hold another run's checkpoints (the
    new run would write its iterations there and move that run's `latest.json`), unless it is the
    folder the run resumes from (`load`) or the user passed --overwrite; nor lie in another run's files."""
    s = resolved(save)
    if s == resolved(Path(run_dir) / "checkpoints"):
        return None
    owner = owning_run(s)
    if owner is not None and owner[0] != resolved(run_dir):
        return (f"actor_config.save: {save} is part of the run directory {owner[0]} ({owner[1]}): another "
                "run's checkpoints are never written; set a new actor_config.save")
    if s.is_file() or (s.exists() and not s.is_dir()):
        return f"actor_config.save: {save} exists and is not a folder"
    held = s.is_dir() and ((s / "latest.json").exists() or any(s.glob("iter_*")))
    if not held or overwrite:
        return None
    if load and (resolved(load) == s or resolved(load).parent == s):
        return None
    return (f"actor_config.save: {save} holds another run's checkpoints; pass --overwrite to replace them, "
            "or set a new actor_config.save")


def run_dir_problem(run_dir: str | os.PathLike[str], inputs: Iterable[Input], save: str | None,
                    load: str | None, overwrite: bool) -> str | None:
    """Why a run may not write `run_dir` (and `actor_config.save`) over its inputs or another run: the
    run directory may not be or lie inside an input, nor hold one among the files it replaces (only
    the checkpoint a run resumes from stays); its checkpoints go to no other run (`checkpoint_problem`)."""
    r = resolved(run_dir)
    for what, given in inputs:
        if given is None or not str(given).strip():
            continue
        i = resolved(given)
        if i == r or i in r.parents:
            return f"trainer.run_dir: {run_dir} is or lies inside the input {what} {given}"
        if r in i.parents:
            name = i.relative_to(r).parts[0]
            if name in RUN_FILES and not (load and name == "checkpoints"):
                return (f"trainer.run_dir: {run_dir} would replace its {name}, which holds the input {what} "
                        f"{given}")
    owner = owning_run(r)
    if owner is not None:
        return f"trainer.run_dir: {run_dir} lies inside the run directory {owner[0]} ({owner[1]})"
    return checkpoint_problem(save, run_dir, load, overwrite) if save else None
