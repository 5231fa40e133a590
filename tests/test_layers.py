"""The layers stay layers, over every package: imports run down (never back up, no circle between
packages), the pure core loads no engine library, only `device.py` and the CPU compatibility module
branch on the device kind, and no function in `asp_npu/` runs over 60 lines.

The layer table is the one `docs/architecture.md` draws; a new package must be placed in it."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "asp_npu"
ENGINES = ("ray", "torch", "vllm", "megatron", "transformers")

# bottom to top; a room (package or top-level module) imports only rooms of its own layer or below
LAYERS: list[tuple[str, set[str]]] = [
    ("base", {"__init__", "errors", "types", "net", "remote", "device", "arch", "io", "validation",
              "interrupt"}),
    ("pure core", {"data", "schedule", "predict", "core", "config", "outputs"}),
    ("engines", {"weights", "rollout", "trainer", "observe"}),
    ("drivers", {"sim", "deploy", "pipeline"}),
    ("cli", {"cli"}),
]
LAYER_OF = {room: i for i, (_, rooms) in enumerate(LAYERS) for room in rooms}
PURE = ("core", "schedule", "predict", "config", "arch", "types", "io", "errors", "validation")
DEVICE_BRANCH_HOMES = {"device.py", "trainer/cpu_compat.py"}


def _room(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> set[str]:
    """Every module a file imports: at the top, inside a function, or under TYPE_CHECKING."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def _files() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def _room_edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for p in _files():
        for mod in _imports(p):
            if mod.startswith("asp_npu."):
                src, dst = _room(p), mod.split(".")[1]
                if src != dst:
                    edges[(src, dst)].append(str(p.relative_to(PKG)))
    return edges


def test_every_room_has_a_layer():
    missing = sorted({_room(p) for p in _files()} - set(LAYER_OF))
    assert not missing, f"place these in LAYERS (and docs/architecture.md): {missing}"


def test_no_import_runs_back_up():
    up = {f"{s} -> {d}": files for (s, d), files in _room_edges().items()
          if s in LAYER_OF and d in LAYER_OF and LAYER_OF[d] > LAYER_OF[s]}
    assert not up, f"imports that run back up a layer: {up}"


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (node -> the nodes it imports), or None."""
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in state and (found := visit(nxt, [*path, node])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [])):
            return found
    return None


def test_no_circle_between_rooms():
    graph: dict[str, set[str]] = defaultdict(set)
    for s, d in _room_edges():
        graph[s].add(d)
    circle = _circle(graph)
    assert circle is None, f"import circle: {' -> '.join(circle)}"


def _module_of(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _module_edges() -> dict[str, set[str]]:
    """asp_npu module -> the asp_npu modules it imports (`from pkg import submodule` counts as one)."""
    known = {_module_of(p) for p in _files()}
    edges: dict[str, set[str]] = defaultdict(set)
    for p in _files():
        src = _module_of(p)
        for node in ast.walk(ast.parse(p.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                           for a in node.names]
            edges[src].update(t for t in targets if t in known and t != src and not src.startswith(t + "."))
    return edges


def test_no_circle_between_files():
    circle = _circle(_module_edges())
    assert circle is None, f"import circle between files: {' -> '.join(circle)}"


def _loaded_after_import(modules: list[str]) -> set[str]:
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules) + "print('\\n'.join(sys.modules))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PKG.parent)
    return set(res.stdout.split())


def _hits(names: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == b or n.startswith(b + ".") for b in banned))


def _module_names(room: str) -> list[str]:
    path = PKG / room
    if path.is_dir():
        return [f"asp_npu.{room}.{p.stem}" if p.stem != "__init__" else f"asp_npu.{room}"
                for p in sorted(path.glob("*.py"))]
    return [f"asp_npu.{room}"]


@pytest.mark.parametrize("room", PURE)
def test_pure_core_loads_no_engine(room):
    files = sorted((PKG / room).glob("*.py")) if (PKG / room).is_dir() else [PKG / f"{room}.py"]
    static = {p.name: _hits(_imports(p), ENGINES) for p in files}
    assert not {k: v for k, v in static.items() if v}, f"{room} imports an engine library: {static}"
    loaded = _hits(_loaded_after_import(_module_names(room)), ENGINES)
    assert not loaded, f"importing asp_npu.{room} loads {loaded[:8]}"


@pytest.mark.parametrize("room,banned", [
    ("sim", ("ray", "torch", "vllm", "asp_npu.pipeline", "asp_npu.rollout", "asp_npu.trainer")),
    ("observe", ENGINES + ("asp_npu.sim", "asp_npu.deploy")),
])
def test_simulator_and_observe_stay_engine_free(room, banned):
    static = {p.name: _hits(_imports(p), banned) for p in sorted((PKG / room).glob("*.py"))}
    assert not {k: v for k, v in static.items() if v}, f"{room} imports {static}"
    loaded = _hits(_loaded_after_import(_module_names(room)), banned)
    assert not loaded, f"importing asp_npu.{room} loads {loaded[:8]}"


def _device_branches(path: Path) -> list[int]:
    """Lines comparing a value with a device kind name ('cpu' / 'npu' / 'cuda'): a device branch."""
    kinds = {"cpu", "npu", "cuda"}
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            consts = [c for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
            consts += [e for c in node.comparators if isinstance(c, ast.Tuple | ast.Set | ast.List)
                       for e in c.elts if isinstance(e, ast.Constant)]
            if any(isinstance(c.value, str) and c.value in kinds for c in consts):
                lines.append(node.lineno)
    return lines


def test_only_the_device_module_branches_on_the_device_kind():
    found = {str(p.relative_to(PKG)): ln for p in _files()
             if str(p.relative_to(PKG)) not in DEVICE_BRANCH_HOMES and (ln := _device_branches(p))}
    assert not found, f"device branches outside {sorted(DEVICE_BRANCH_HOMES)}: {found}"


def test_no_function_over_60_lines():
    long = [f"{p.relative_to(PKG)}:{n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for p in _files() for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.end_lineno is not None
            and n.end_lineno - n.lineno + 1 > 60]
    assert not long, f"functions over 60 lines (split them by step): {long}"
