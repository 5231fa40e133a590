"""Response-length traces: the columnar `Trace`, its validated JSONL reader/writer, and a generator.

A trace row is `{"prompt_id", "epoch", "sample_idx", "prompt_len", "response_len"}`; a GRPO group is
one prompt's samples in one epoch. Traces reach a million rows, so everything here is columnar
numpy (prompt ids dictionary-encoded to int codes). Reading takes a fast path (pyarrow's JSON reader
+ vectorised checks) and, on any defect, re-reads with `asp_npu.io.read_jsonl` to name `file:line`.

The generator's model and the source of each default are documented in docs/traces.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asp_npu.errors import InvalidValue, UserError
from asp_npu.io import atomic_write, check_readable, check_writable, read_jsonl
from asp_npu.validation import SEED_MAX, check_float, check_int

FIELDS = ("prompt_id", "epoch", "sample_idx", "prompt_len", "response_len")
_INT_MAX = 2**31 - 1


@dataclass
class Trace:
    """Columnar trace. `prompt_names[prompt_code[i]]` is row i's prompt id."""

    prompt_names: np.ndarray  # (n_prompts,) str, unique
    prompt_code: np.ndarray  # (rows,) int64 index into prompt_names
    epoch: np.ndarray  # (rows,) int64
    sample_idx: np.ndarray  # (rows,) int64
    prompt_len: np.ndarray  # (rows,) int64
    response_len: np.ndarray  # (rows,) int64
    source: str = field(default="<memory>")

    def __len__(self) -> int:
        return int(self.prompt_code.shape[0])

    @property
    def epochs(self) -> np.ndarray:
        return np.unique(self.epoch)

    def select(self, mask: np.ndarray) -> Trace:
        """Rows where `mask` holds (prompt_names kept, so codes stay comparable)."""
        return Trace(
            self.prompt_names,
            self.prompt_code[mask],
            self.epoch[mask],
            self.sample_idx[mask],
            self.prompt_len[mask],
            self.response_len[mask],
            self.source,
        )

    def epoch_rows(self, epoch: int) -> Trace:
        check_int("epoch", epoch, 0, _INT_MAX)
        if not np.any(self.epoch == epoch):
            have = ", ".join(str(int(e)) for e in self.epochs[:20])
            raise UserError(f"{self.source}: epoch {epoch} is not in the trace (epochs: {have})")
        return self.select(self.epoch == epoch)

    def before(self, epoch: int) -> Trace:
        return self.select(self.epoch < epoch)

    @classmethod
    def from_columns(
        cls,
        prompt_ids: np.ndarray | list[Any],
        epoch: np.ndarray | list[int],
        sample_idx: np.ndarray | list[int],
        prompt_len: np.ndarray | list[int],
        response_len: np.ndarray | list[int],
        source: str = "<memory>",
    ) -> Trace:
        names, codes = np.unique(np.asarray(prompt_ids).astype(str), return_inverse=True)
        return cls(
            names,
            codes.astype(np.int64),
            np.asarray(epoch, dtype=np.int64),
            np.asarray(sample_idx, dtype=np.int64),
            np.asarray(prompt_len, dtype=np.int64),
            np.asarray(response_len, dtype=np.int64),
            source,
        )


# ---------------------------------------------------------------------------------------------- read


def _row_checks() -> dict[str, tuple[Any, ...]]:
    nonneg = (lambda v: 0 <= v <= _INT_MAX, "must be an integer in [0, 2^31)")
    positive = (lambda v: 0 < v <= _INT_MAX, "must be a positive integer (< 2^31)")
    return {
        "prompt_id": ((str, int), lambda v: str(v) != "", "must be a non-empty string"),
        "epoch": (int, *nonneg),
        "sample_idx": (int, *nonneg),
        "prompt_len": (int, *positive),
        "response_len": (int, *positive),
    }


def _read_slow(path: Path) -> Trace:
    """Row-by-row reader with exact `file:line` errors; also the fallback for odd but valid files."""
    cols: dict[str, list[Any]] = {f: [] for f in FIELDS}
    seen: dict[tuple[str, int, int], int] = {}
    for line_no, row in read_jsonl(path, _row_checks()):
        key = (str(row["prompt_id"]), row["epoch"], row["sample_idx"])
        if key in seen:
            raise UserError(
                f"{path}:{line_no}: duplicate sample (prompt_id={key[0]!r}, epoch={key[1]}, "
                f"sample_idx={key[2]}) first seen on line {seen[key]}"
            )
        seen[key] = line_no
        for f in FIELDS:
            cols[f].append(row[f])
    if not cols["epoch"]:
        raise UserError(f"{path}: trace is empty")
    return Trace.from_columns(
        cols["prompt_id"], cols["epoch"], cols["sample_idx"], cols["prompt_len"], cols["response_len"],
        source=str(path),
    )


def _read_fast(path: Path) -> Trace | None:
    """pyarrow + vectorised validation; None when anything is off (the slow path then explains)."""
    try:
        import pyarrow as pa
        import pyarrow.json as pj
    except ImportError:  # pragma: no cover - pyarrow is in requirements.txt
        return None
    schema = pa.schema([("prompt_id", pa.string())] + [(f, pa.int64()) for f in FIELDS[1:]])
    opts = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    try:
        table = pj.read_json(str(path), read_options=pj.ReadOptions(block_size=1 << 24), parse_options=opts)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError):
        return None
    if table.num_rows == 0 or any(table.column(f).null_count for f in FIELDS):
        return None
    enc = table.column("prompt_id").combine_chunks().dictionary_encode()
    try:
        names = np.asarray(enc.dictionary.to_pylist(), dtype=str)
    except UnicodeDecodeError:  # pyarrow keeps invalid UTF-8 in strings; the slow path names the line
        return None
    codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    ints = {f: table.column(f).to_numpy().astype(np.int64, copy=False) for f in FIELDS[1:]}
    if np.any(names == ""):
        return None
    if (
        np.any(ints["epoch"] < 0)
        or np.any(ints["sample_idx"] < 0)
        or any(np.any(ints[f] <= 0) or np.any(ints[f] > _INT_MAX) for f in ("prompt_len", "response_len"))
        or np.any(ints["epoch"] > _INT_MAX)
        or np.any(ints["sample_idx"] > _INT_MAX)
    ):
        return None
    # duplicates of (prompt, epoch, sample_idx)
    key = np.lexsort((ints["sample_idx"], ints["epoch"], codes))
    same = (
        (np.diff(codes[key]) == 0)
        & (np.diff(ints["epoch"][key]) == 0)
        & (np.diff(ints["sample_idx"][key]) == 0)
    )
    if np.any(same):
        return None
    # canonical name order (sorted) so codes do not depend on the reader path
    order = np.argsort(names, kind="stable")
    remap = np.empty_like(order)
    remap[order] = np.arange(order.size)
    return Trace(
        names[order], remap[codes], ints["epoch"], ints["sample_idx"], ints["prompt_len"],
        ints["response_len"], source=str(path),
    )


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate a JSONL trace; any defect -> UserError naming `file:line` and what."""
    p = check_readable(path, "JSONL trace")
    trace = _read_fast(p)
    if trace is None:
        trace = _read_slow(p)
    return trace


# --------------------------------------------------------------------------------------------- write


def trace_lines(trace: Trace, chunk: int = 100_000) -> Iterator[str]:
    """Yield JSONL text chunks (many rows each) without one dict per row."""
    names = json_escaped(trace.prompt_names)
    for lo in range(0, len(trace), chunk):
        hi = min(lo + chunk, len(trace))
        pid = names[trace.prompt_code[lo:hi]].tolist()
        cols = zip(
            pid,
            trace.epoch[lo:hi].tolist(),
            trace.sample_idx[lo:hi].tolist(),
            trace.prompt_len[lo:hi].tolist(),
            trace.response_len[lo:hi].tolist(),
            strict=True,
        )
        row = '{{"prompt_id": "{}", "epoch": {}, "sample_idx": {}, "prompt_len": {}, "response_len": {}}}\n'
        yield "".join(row.format(*c) for c in cols)


def write_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Atomically write `trace` as JSONL."""
    check_writable(path)
    return atomic_write(path, "".join(trace_lines(trace)))


def json_escaped(names: np.ndarray) -> np.ndarray:
    """String contents as they appear between JSON quotes (escaped only where needed)."""
    as_list = names.tolist()
    if all(n.isprintable() and '"' not in n and "\\" not in n for n in as_list):
        return names
    return np.array([json.dumps(n)[1:-1] for n in as_list], dtype=str)


# ----------------------------------------------------------------------------------------- synthetic


@dataclass(frozen=True)
class SynthParams:
    """Generator knobs; docs/traces.md says where each default comes from."""

    prompts: int = 1000
    epochs: int = 4
    n: int = 16  # samples per prompt (GRPO group size)
    seed: int = 0
    median_len: float = 2048.0  # median response tokens
    sigma_prompt: float = 0.80  # log-sd of per-prompt difficulty (persists across epochs)
    sigma_epoch: float = 0.25  # log-sd of a prompt's epoch-to-epoch change (imperfect persistence)
    sigma_sample: float = 0.50  # log-sd of samples within one group
    max_len: int = 16384  # generation cap (max_tokens); samples above are truncated to it
    min_len: int = 16
    drift: float = 0.0  # log-length change per epoch (0.05 ~ +5%/epoch)
    prompt_median: float = 160.0  # median prompt tokens
    prompt_sigma: float = 0.5  # log-sd of prompt length
    prompt_corr: float = 0.3  # correlation of log prompt length with difficulty

    def validate(self) -> None:
        """Every knob in range (NaN, inf, wrong types refused), so the trace written is one that
        `read_trace` accepts: lengths positive and below 2^31."""
        for name in ("prompts", "epochs", "n"):
            check_int(_flag(name), getattr(self, name), 1, _INT_MAX)
        check_int(_flag("seed"), self.seed, 0, SEED_MAX)
        check_int(_flag("max_len"), self.max_len, 1, _INT_MAX)
        check_int(_flag("min_len"), self.min_len, 1, _INT_MAX)
        if self.min_len > self.max_len:
            raise InvalidValue(f"--min-len {self.min_len} exceeds --max-len {self.max_len}")
        for name in ("median_len", "prompt_median"):
            check_float(_flag(name), getattr(self, name), 0.0, float(_INT_MAX), lo_open=True)
        for name in ("sigma_prompt", "sigma_epoch", "sigma_sample", "prompt_sigma"):
            check_float(_flag(name), getattr(self, name), 0.0, MAX_SIGMA)
        check_float(_flag("drift"), self.drift, -MAX_SIGMA, MAX_SIGMA)
        check_float(_flag("prompt_corr"), self.prompt_corr, -1.0, 1.0)
        if self.prompts * self.epochs * self.n > 200_000_000:
            raise InvalidValue("trace would exceed 200M rows")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


MAX_SIGMA = 10.0  # log-space spreads and drift per epoch beyond this are not length distributions


def synth_trace(params: SynthParams) -> Trace:
    """Long-tailed reasoning-RL lengths: log L = log median + difficulty + epoch wobble + drift + noise."""
    params.validate()
    rng = np.random.default_rng(params.seed)
    P, E, n = params.prompts, params.epochs, params.n
    difficulty = rng.normal(0.0, params.sigma_prompt, P)
    z = difficulty / params.sigma_prompt if params.sigma_prompt > 0 else np.zeros(P)
    rho = params.prompt_corr
    log_prompt = np.log(params.prompt_median) + params.prompt_sigma * (
        rho * z + np.sqrt(max(0.0, 1 - rho * rho)) * rng.standard_normal(P)
    )
    prompt_len = np.clip(np.round(np.exp(np.minimum(log_prompt, 22.0))), 1, _INT_MAX).astype(np.int64)
    wobble = rng.normal(0.0, params.sigma_epoch, (E, P))
    noise = rng.normal(0.0, params.sigma_sample, (E, P, n))
    log_len = (
        np.log(params.median_len)
        + difficulty[None, :, None]
        + wobble[:, :, None]
        + params.drift * np.arange(E)[:, None, None]
        + noise
    )
    resp = np.clip(np.round(np.exp(np.minimum(log_len, 40.0))), params.min_len, params.max_len).astype(
        np.int64
    )
    width = max(6, len(str(P - 1)))
    names = np.array([f"p{i:0{width}d}" for i in range(P)])
    ep, pr, sm = np.meshgrid(np.arange(E), np.arange(P), np.arange(n), indexing="ij")
    return Trace(
        names,
        pr.ravel().astype(np.int64),
        ep.ravel().astype(np.int64),
        sm.ravel().astype(np.int64),
        prompt_len[pr.ravel()],
        resp.ravel(),
        source="<synth>",
    )


def group_table(trace: Trace) -> tuple[np.ndarray, np.ndarray, int]:
    """Rows of one epoch as groups: (prompt codes (g,), row index matrix (g, n) sorted by sample_idx,
    group size n). Raises UserError when groups differ in size."""
    if len(trace) == 0:
        raise UserError(f"{trace.source}: no rows to group")
    order = np.lexsort((trace.sample_idx, trace.prompt_code))
    codes = trace.prompt_code[order]
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    sizes = np.diff(np.r_[starts, codes.size])
    if np.any(sizes != sizes[0]):
        i = int(np.argmax(sizes != sizes[0]))
        raise UserError(
            f"{trace.source}: groups differ in size ({str(trace.prompt_names[codes[starts[0]]])!r} has "
            f"{sizes[0]} samples, {str(trace.prompt_names[codes[starts[i]]])!r} has {sizes[i]}); "
            "GRPO groups must all hold n samples"
        )
    n = int(sizes[0])
    return codes[starts], order.reshape(-1, n), n
