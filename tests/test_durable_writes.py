"""Durable writes of whole folders (models) and of files drawn by a producer (plots, reports).

A folder is written beside its target under a unique temp name, fsync'd and swapped in: whatever fails
(an exception mid-write, a full disk, an unwritable folder, a failed swap), the previous folder is left
byte-identical and no temp is left behind; at no moment is the target missing.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from asp_npu import io
from asp_npu.errors import UserError


def tree(folder: Path) -> dict[str, str]:
    """Every entry under `folder` with its kind and, for files, its content hash."""
    out = {}
    for p in sorted(folder.rglob("*")):
        mode = p.lstat().st_mode
        key = str(p.relative_to(folder))
        out[key] = hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(mode) else stat.filemode(mode)
    return out


def old_folder(tmp_path: Path) -> Path:
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text('{"old": 1}')
    (out / "model.safetensors").write_bytes(b"old weights")
    return out


def fill_new(tmp: Path) -> None:
    (tmp / "config.json").write_text('{"new": 2}')
    (tmp / "sub").mkdir()
    (tmp / "sub" / "w.bin").write_bytes(b"new" * 100)


def enospc(*_a: object, **_k: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


class Boom(RuntimeError):
    pass


def _raise(exc: BaseException):
    def fill(tmp: Path) -> None:
        (tmp / "config.json").write_text("half")
        raise exc
    return fill


@pytest.mark.parametrize("exc", [Boom("mid-write"), OSError(errno.ENOSPC, "No space left on device"),
                                 KeyboardInterrupt()], ids=["exception", "full-disk", "interrupt"])
def test_failed_fill_leaves_the_old_folder_and_no_temp(tmp_path: Path, exc: BaseException) -> None:
    out = old_folder(tmp_path)
    before = tree(tmp_path)
    with pytest.raises((Boom, UserError, KeyboardInterrupt)) as info:
        io.atomic_replace_dir(out, _raise(exc))
    if isinstance(exc, OSError):
        assert info.type is UserError and "No space left" in str(info.value) and "\n" not in str(info.value)
    assert tree(tmp_path) == before


def test_full_disk_at_fsync_leaves_the_old_folder(tmp_path: Path, monkeypatch) -> None:
    out = old_folder(tmp_path)
    before = tree(tmp_path)
    monkeypatch.setattr(io.os, "fsync", enospc)
    with pytest.raises(UserError, match="No space left"):
        io.atomic_replace_dir(out, fill_new)
    assert tree(tmp_path) == before


def test_unwritable_folder_is_one_line_and_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    out = old_folder(tmp_path)
    before = tree(tmp_path)

    def denied(*_a: object, **_k: object) -> str:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(io.tempfile, "mkdtemp", denied)
    with pytest.raises(UserError, match="Permission denied"):
        io.atomic_replace_dir(out, fill_new)
    assert tree(tmp_path) == before
    monkeypatch.undo()
    with pytest.raises(UserError):
        io.atomic_replace_dir(Path("/proc/asp_npu_durable_test"), fill_new)


def test_replace_swaps_in_the_whole_new_folder_and_the_target_is_never_missing(tmp_path: Path,
                                                                              monkeypatch) -> None:
    out = old_folder(tmp_path)
    seen: list[bool] = []
    real_exchange, real_rename = io._exchange, os.rename

    def exchange(a: Path, b: Path) -> bool:
        seen.append(b.is_dir() and (b / "config.json").read_text() == '{"old": 1}')
        return real_exchange(a, b)

    def rename(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> None:
        seen.append(not Path(b).exists() and Path(a) != out)  # renaming the old folder away: a gap
        real_rename(a, b)

    monkeypatch.setattr(io, "_exchange", exchange)
    monkeypatch.setattr(io.os, "rename", rename)
    io.atomic_replace_dir(out, fill_new)
    assert seen and all(seen)
    assert (out / "config.json").read_text() == '{"new": 2}' and (out / "sub" / "w.bin").exists()
    assert not (out / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~io._umask()


def test_without_rename_exchange_a_failed_swap_puts_the_old_folder_back(tmp_path: Path,
                                                                       monkeypatch) -> None:
    out = old_folder(tmp_path)
    before = tree(tmp_path)
    monkeypatch.setattr(io, "_exchange", lambda a, b: False)
    real_rename = os.rename

    def rename(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> None:
        if Path(b) == out and str(a).endswith(".tmp"):  # the new folder into place: the disk goes away
            raise OSError(errno.EIO, "Input/output error")
        real_rename(a, b)

    monkeypatch.setattr(io.os, "rename", rename)
    with pytest.raises(UserError, match="Input/output error"):
        io.atomic_replace_dir(out, fill_new)
    assert tree(tmp_path) == before
    monkeypatch.setattr(io.os, "rename", real_rename)
    io.atomic_replace_dir(out, fill_new)  # the fallback path itself works
    assert (out / "config.json").read_text() == '{"new": 2}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_temp_names_are_unique_and_a_fixed_tmp_name_is_not_touched(tmp_path: Path) -> None:
    out = old_folder(tmp_path)
    stranger = tmp_path / "model.tmp"  # what the old code wrote to (and deleted): someone else's now
    stranger.mkdir()
    (stranger / "x").write_text("theirs")
    temps: list[Path] = []
    for _ in range(2):
        io.atomic_replace_dir(out, lambda tmp: (temps.append(tmp), fill_new(tmp)))
    assert len(set(temps)) == 2 and all(t.parent == tmp_path and t != stranger for t in temps)
    assert (stranger / "x").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.tmp"]


def test_every_file_and_folder_is_fsynced_before_the_swap(tmp_path: Path, monkeypatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(io.os, "fsync", fsync)
    out = io.atomic_replace_dir(tmp_path / "m", fill_new)
    names = {Path(s).name for s in synced}
    assert {"config.json", "w.bin", "sub"} <= names  # the files and the folder holding them
    assert str(tmp_path) in synced  # the parent, after the rename
    assert (out / "sub" / "w.bin").read_bytes() == b"new" * 100


@pytest.mark.parametrize("special", ["fifo", "/dev/null"])
def test_a_special_file_is_never_replaced_by_a_folder(tmp_path: Path, special: str) -> None:
    target = Path(special)
    if special == "fifo":
        target = tmp_path / "f"
        os.mkfifo(target)
    mode = os.lstat(target).st_mode
    with pytest.raises(UserError, match="not a regular file"):
        io.atomic_replace_dir(target, fill_new)
    assert os.lstat(target).st_mode == mode
    with pytest.raises(UserError, match="not a regular file"):
        io.check_folder_writable(target)


def test_save_hf_folder_full_disk_keeps_the_previous_model(tmp_path: Path, monkeypatch) -> None:
    import shutil

    from asp_npu.trainer.hf_export import save_hf_folder
    from asp_npu.weights.hf import HFWeights

    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "qwen2"}')
    (src / "tokenizer.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"src weights")
    w = HFWeights(1, {"a.weight": np.ones((2, 3), np.float32)})
    out = save_hf_folder(w, src, tmp_path / "out")
    assert sorted(p.name for p in out.iterdir()) == [
        ".asp-npu-model", "asp_npu_export.json", "config.json", "generation_config.json",
        "model-00001-of-00001.safetensors", "model.safetensors.index.json", "tokenizer.json"]
    before = tree(tmp_path)
    monkeypatch.setattr(shutil, "copy2", enospc)
    with pytest.raises(UserError, match="No space left"):
        save_hf_folder(HFWeights(2, {"a.weight": np.zeros((2, 3), np.float32)}), src, out)
    assert tree(tmp_path) == before


def test_init_model_failure_mid_write_keeps_the_previous_model(tmp_path: Path, monkeypatch) -> None:
    from asp_npu.data import init_model

    class Tok:
        pad_token_id, bos_token_id, eos_token_id = 0, 1, 2

        def __len__(self) -> int:
            return 10

        def save_pretrained(self, folder: Path) -> None:
            (Path(folder) / "tokenizer.json").write_text("{}")

    class Model:
        def save_pretrained(self, folder: Path) -> None:
            (Path(folder) / "model.safetensors").write_bytes(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(init_model, "build_tokenizer", lambda *a, **k: Tok())
    monkeypatch.setattr(init_model, "build_model", lambda *a, **k: Model())
    out = old_folder(tmp_path)
    before = tree(tmp_path)
    with pytest.raises(UserError, match="No space left"):
        init_model.build_model_dir(out, force=True)
    assert tree(tmp_path) == before


def test_failed_producer_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "report.png"
    target.write_bytes(b"old png")

    def savefig(f: object) -> None:
        raise ValueError("cannot draw")

    with pytest.raises(ValueError):
        io.atomic_write_with(target, savefig)
    assert [p.name for p in tmp_path.iterdir()] == ["report.png"] and target.read_bytes() == b"old png"


def test_bench_sim_plot_and_timeline_are_atomic(tmp_path: Path, monkeypatch) -> None:
    from asp_npu.cli.bench_sim import main

    argv = ["--preset", "tiny", "--iterations", "2", "--modes", "asp,async-fifo"]
    plot, timeline = tmp_path / "p.png", tmp_path / "t.json"
    assert main([*argv, "--plot", str(plot), "--timeline", str(timeline)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and timeline.stat().st_size > 0
    before = tree(tmp_path)
    monkeypatch.setattr(io.os, "fsync", enospc)
    with pytest.raises(UserError, match="No space left"):
        main([*argv, "--plot", str(plot)])
    with pytest.raises(UserError, match="No space left"):
        main([*argv, "--timeline", str(timeline)])
    assert tree(tmp_path) == before
