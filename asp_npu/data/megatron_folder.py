"""A Megatron checkpoint folder (Megatron-LM / MindSpeed-LLM, legacy or dist) read from its names alone.

Config validation and the importer tell an asp-npu checkpoint (resume) from foreign Megatron weights
(the initial policy) and check the rank grid against the model here, without torch; the tensors are
read by `asp_npu.trainer.megatron_ckpt`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from asp_npu.arch import ModelDims
from asp_npu.errors import UserError

TRACKER = "latest_checkpointed_iteration.txt"
OURS = ("latest.json", "trainer.json")  # checkpoint.POINTER / TRAINER_META (that module imports torch)
LEGACY_FILE = "model_optim_rng.pt"
_RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")
_ITER_DIR = re.compile(r"^(iter_\d{7}|release)$")


@dataclass(frozen=True)
class MegatronFolder:
    """One iteration of a Megatron checkpoint: where, which layout, and its rank grid (legacy)."""

    path: Path  # the iteration folder
    layout: str  # "legacy" | "dist"
    ranks: dict[tuple[int, int, int], Path]  # (tp, pp, ep) -> model_optim_rng.pt (legacy only)

    @property
    def tp(self) -> int:
        return 1 + max((r[0] for r in self.ranks), default=0)

    @property
    def pp(self) -> int:
        return 1 + max((r[1] for r in self.ranks), default=0)

    @property
    def ep(self) -> int:
        return 1 + max((r[2] for r in self.ranks), default=0)


def is_ours(path: str | Path) -> bool:
    """An asp-npu trainer checkpoint: a `latest.json` pointer or one iteration's `trainer.json`."""
    return any((Path(path) / name).is_file() for name in OURS)


def is_megatron(path: str | Path) -> bool:
    """Megatron weights that are not an asp-npu checkpoint (cheap: names only, nothing is read)."""
    p = Path(path)
    if not p.is_dir() or is_ours(p):
        return False
    if (p / TRACKER).is_file() or (p / "metadata.json").is_file():
        return True
    return any(_RANK_DIR.match(c.name) or _ITER_DIR.match(c.name) for c in p.iterdir())


def _iteration(path: Path, what: str) -> Path:
    """The iteration folder `path` names: via the tracker file, or `path` itself."""
    tracker = path / TRACKER
    if tracker.is_file():
        text = tracker.read_text(errors="replace").strip()
        if text != "release" and not text.isdigit():
            raise UserError(f"{what}: {tracker} is torn or not an iteration number ({text[:40]!r})")
        it = path / ("release" if text == "release" else f"iter_{int(text):07d}")
        if not it.is_dir():
            raise UserError(f"{what}: {tracker} names {it.name}, which is missing")
        return it
    if (path / "metadata.json").is_file() or any(_RANK_DIR.match(c.name) for c in path.iterdir()):
        return path
    iters = sorted(c.name for c in path.iterdir() if _ITER_DIR.match(c.name))
    hint = f" (it has {iters[-1]} but no {TRACKER}: name the iteration folder)" if iters else ""
    raise UserError(f"{what}: '{path}' holds no Megatron checkpoint ({TRACKER}, iter_*/mp_rank_*/"
                    f"{LEGACY_FILE} or a dist checkpoint's metadata.json){hint}")


def _legacy_ranks(it: Path, what: str) -> dict[tuple[int, int, int], Path]:
    ranks: dict[tuple[int, int, int], Path] = {}
    for c in it.iterdir():
        m = _RANK_DIR.match(c.name)
        if m:
            ranks[(int(m[1]), int(m[2] or 0), int(m[3] or 0))] = c / LEGACY_FILE
    if not ranks:
        raise UserError(f"{what}: {it} holds no mp_rank_* folders")
    tp, pp, ep = (1 + max(r[i] for r in ranks) for i in range(3))
    grid = [(t, p, e) for t in range(tp) for p in range(pp) for e in range(ep)]
    missing = [r for r in grid if not ranks.get(r, Path("/nonexistent")).is_file()]
    if missing:
        names = ", ".join(_rank_name(r, pp, ep) for r in missing[:4])
        raise UserError(f"{what}: {it} is missing {len(missing)} of {len(grid)} model-parallel ranks "
                        f"(TP={tp} x PP={pp}{f' x EP={ep}' if ep > 1 else ''}): {names}")
    return ranks


def _rank_name(r: tuple[int, int, int], pp: int, ep: int) -> str:
    return f"mp_rank_{r[0]:02d}" + (f"_{r[1]:03d}" if pp > 1 else "") + (f"_{r[2]:03d}" if ep > 1 else "") \
        + f"/{LEGACY_FILE}"


def locate(path: str | Path, what: str = "model.load_megatron") -> MegatronFolder:
    """Resolve and check a Megatron checkpoint folder from names alone (config validation uses it):
    a torn tracker, a missing iteration, missing ranks and an incomplete dist checkpoint are refused."""
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"{what}: '{path}' is not a folder")
    it = _iteration(p, what)
    if (it / "metadata.json").is_file():
        if not (it / ".metadata").is_file():
            raise UserError(f"{what}: {it} is an incomplete dist checkpoint (no .metadata)")
        return MegatronFolder(it, "dist", {})
    return MegatronFolder(it, "legacy", _legacy_ranks(it, what))


def dims_problems(folder: MegatronFolder, dims: ModelDims, what: str = "model.load_megatron") -> list[str]:
    """A rank grid the model of `model.path` cannot have been split into (legacy layout)."""
    if folder.layout != "legacy":
        return []
    out = []
    if dims.num_attention_heads % folder.tp or dims.num_key_value_heads % folder.tp:
        out.append(f"{what}: {folder.path} is split over TP={folder.tp}, which does not divide the "
                   f"{dims.num_attention_heads} attention heads / {dims.num_key_value_heads} query groups "
                   "of model.path")
    if folder.pp > dims.num_layers:
        out.append(f"{what}: {folder.path} has {folder.pp} pipeline stages for {dims.num_layers} layers")
    if folder.ep > 1 and (not dims.num_experts or dims.num_experts % folder.ep):
        out.append(f"{what}: {folder.path} is split over EP={folder.ep}, which does not divide the "
                   f"{dims.num_experts} experts of model.path")
    return out
