"""Rules of the code's shape that a refactor could silently break (docs/architecture.md, "Rules").

- The CLI sits on top: no library module imports `asp_npu.cli`, and every command word maps to an
  `asp_npu/cli/<command>.py` module with a `main`.
- The device layer sits below the trainer: `asp_npu/device.py` imports no trainer module.
- The repository is self-contained: no tracked file points at design notes outside it.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

from asp_npu.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "asp_npu"


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (lazy imports inside functions count)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_no_library_module_imports_the_cli() -> None:
    offenders = {
        str(p.relative_to(ROOT)): sorted(n for n in _imports(p) if _within(n, "asp_npu.cli"))
        for p in PACKAGE.rglob("*.py")
        if not _within(".".join(p.relative_to(ROOT).with_suffix("").parts), "asp_npu.cli")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_every_command_is_a_cli_module_with_a_main() -> None:
    for words, (module, _) in COMMANDS.items():
        assert _within(module, "asp_npu.cli"), f"`asp-npu {words}` runs {module}, outside asp_npu/cli"
        path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
        tree = ast.parse(path.read_text(), str(path))
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), path


def test_device_layer_imports_no_trainer_module() -> None:
    found = sorted(n for n in _imports(PACKAGE / "device.py") if _within(n, "asp_npu.trainer"))
    assert found == [], f"asp_npu/device.py imports {found}: the trainer must call down, not be called"


def _tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_tracked_file_points_outside_the_repository() -> None:
    needles = ("../" + "shared", "/work/" + "shared")  # split, so this file does not match itself
    offenders = []
    for path in _tracked_files():
        if not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        offenders += [f"{path.relative_to(ROOT)}: {n}" for n in needles if n in text]
    assert offenders == [], "point at docs/architecture.md instead:\n" + "\n".join(offenders)
