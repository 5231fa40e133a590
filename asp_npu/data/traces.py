"""Response-length traces: the columnar `Trace`, its validated JSONL reader/writer, and a generator.

A trace row is `{"prompt_id", "epoch", "sample_idx", "prompt_len", "response_len"}`; a GRPO group is
one prompt's samples in one epoch. A multi-turn trace (tool-calling trajectories) also carries each
row's turns (`Turns`: model tokens per turn, tool-output tokens and tool latency between turns); its
generator `synth_multiturn` is in-memory only (the JSONL format stays single-turn).

Traces reach a million rows, so everything here is columnar numpy (prompt ids dictionary-encoded
to int codes). Reading takes a fast path (pyarrow's JSON reader + vectorised checks) and, on any
defect, re-reads with `asp_npu.io.read_jsonl` to name `file:line`.

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
    turns: Turns | None = None  # multi-turn traces: each row's turns (`Turns`); None = single-turn

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
            None if self.turns is None else self.turns.take(np.flatnonzero(mask)),
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


# ---------------------------------------------------------------------------------------- multi-turn


@dataclass
class Turns:
    """Per-row turn structure of a multi-turn trace (columnar; rows align with the trace's rows).

    Row i's turns are the flat positions `offsets[i] .. offsets[i+1]-1`: turn k decodes `model[k]`
    tokens, then (every turn but the last) its tool call runs `tool_s[k]` seconds and appends
    `tool_tokens[k]` tokens to the context (0 and 0.0 after the last turn). A row's `response_len` is
    the sum of its model tokens: the tokens the policy generates and trains on (tool tokens carry no
    gradient, but are context for the turns after them and sequence tokens for the trainer).
    """

    offsets: np.ndarray  # (rows + 1,) int64
    model: np.ndarray  # (turns,) int64, >= 1
    tool_tokens: np.ndarray  # (turns,) int64, >= 0; 0 after a row's last turn
    tool_s: np.ndarray  # (turns,) float64, >= 0; 0 after a row's last turn

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @property
    def counts(self) -> np.ndarray:
        """Turns per row."""
        return np.diff(self.offsets)

    def per_row(self, flat: np.ndarray) -> np.ndarray:
        """Sum of a flat per-turn array over each row's turns."""
        return np.add.reduceat(flat, self.offsets[:-1]) if len(self) else flat[:0]

    @staticmethod
    def concat(parts: list[Turns]) -> Turns:
        counts = np.concatenate([t.counts for t in parts])
        off = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=off[1:])
        cat = [np.concatenate([getattr(t, f) for t in parts]) for f in ("model", "tool_tokens", "tool_s")]
        return Turns(off, cat[0], cat[1], cat[2])

    def take(self, rows: np.ndarray) -> Turns:
        """The rows `rows` (int indices, any order), re-packed."""
        rows = np.asarray(rows, dtype=np.int64).ravel()
        lo, n = self.offsets[rows], self.counts[rows]
        off = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(n, out=off[1:])
        pos = np.arange(int(off[-1]), dtype=np.int64) - np.repeat(off[:-1], n) + np.repeat(lo, n)
        return Turns(off, self.model[pos], self.tool_tokens[pos], self.tool_s[pos])


@dataclass(frozen=True)
class MultiTurnParams:
    """Knobs of the multi-turn (tool-calling) trajectory generator; docs/traces.md gives the model.

    Two shapes of the turn count, both persistent per prompt (a prompt that needs many tool calls
    needs them again next epoch, as a hard problem keeps a long response):
    - `geometric`: turns = 1 + Poisson(lambda_p - 1) with lambda_p log-normal around `mean_turns`;
    - `bimodal`: each sample answers directly (1 turn) with the prompt's probability, else it
      iterates around `mean_turns_long` turns (the agent either trusts itself or loops on the tool).
    Per-turn model tokens are log-normal (the first turn `first_turn_factor` longer: it plans);
    tool-output tokens log-normal, cut at `tool_tokens_cap` (the loop's output cap); tool latency
    log-normal with a Pareto tail (`tail_prob` of the calls), cut at `tool_timeout_s`.
    """

    prompts: int = 1000
    epochs: int = 4
    n: int = 8
    seed: int = 0
    shape: str = "geometric"  # geometric | bimodal
    mean_turns: float = 3.0  # geometric: median of a prompt's mean turn count
    sigma_turns: float = 0.5  # log-sd of a prompt's mean turn count across prompts
    direct_frac: float = 0.5  # bimodal: mean probability that a sample answers in one turn
    mean_turns_long: float = 8.0  # bimodal: mean turns of a sample that iterates
    max_turns: int = 16  # the loop's cap on turns
    turn_median: float = 384.0  # median model tokens per turn
    first_turn_factor: float = 2.0  # the first turn (planning) is this much longer
    sigma_prompt: float = 0.6  # log-sd of per-prompt verbosity (persists across epochs)
    sigma_epoch: float = 0.2  # log-sd of a prompt's epoch-to-epoch change
    sigma_turn: float = 0.6  # log-sd of one turn's tokens around its sample's level
    max_len: int = 16384  # cap on a trajectory's model tokens (the trajectory ends there)
    tool_tokens_median: float = 96.0
    tool_tokens_sigma: float = 1.0
    tool_tokens_cap: int = 4096
    tool_median_s: float = 1.0  # median tool latency (body)
    tool_sigma: float = 0.8  # log-sd of the latency body
    tail_prob: float = 0.05  # share of calls in the heavy tail
    tail_scale_s: float = 5.0  # Pareto scale of the tail
    tail_alpha: float = 1.5  # Pareto shape (finite mean, infinite variance)
    tool_timeout_s: float = 60.0  # every call is cut here
    prompt_median: float = 256.0  # median prompt tokens (system prompt with tool schemas)
    prompt_sigma: float = 0.4

    def validate(self) -> None:
        for name in ("prompts", "epochs", "n", "max_turns", "max_len", "tool_tokens_cap"):
            check_int(_flag(name), getattr(self, name), 1, _INT_MAX)
        check_int(_flag("seed"), self.seed, 0, SEED_MAX)
        if self.shape not in ("geometric", "bimodal"):
            raise InvalidValue(f"multi-turn shape must be geometric|bimodal (got {self.shape!r})")
        for name in ("mean_turns", "mean_turns_long"):
            check_float(_flag(name), getattr(self, name), 1.0, float(self.max_turns))
        for name in ("turn_median", "tool_tokens_median", "tool_median_s", "tail_scale_s", "tool_timeout_s",
                     "prompt_median", "first_turn_factor", "tail_alpha"):
            check_float(_flag(name), getattr(self, name), 0.0, 1e9, lo_open=True)
        for name in ("sigma_turns", "sigma_prompt", "sigma_epoch", "sigma_turn", "tool_tokens_sigma",
                     "tool_sigma", "prompt_sigma"):
            check_float(_flag(name), getattr(self, name), 0.0, MAX_SIGMA)
        for name in ("direct_frac", "tail_prob"):
            check_float(_flag(name), getattr(self, name), 0.0, 1.0)
        if self.prompts * self.epochs * self.n * self.max_turns > 200_000_000:
            raise InvalidValue("multi-turn trace would exceed 200M turns")


def _turn_counts(p: MultiTurnParams, rng: np.random.Generator, shape: tuple[int, int, int]) -> np.ndarray:
    """Turns per sample, (E, P, n): persistent per prompt, capped at `max_turns`."""
    E, P, n = shape
    if p.shape == "geometric":
        lam = p.mean_turns * np.exp(rng.normal(0.0, p.sigma_turns, P) - p.sigma_turns**2 / 2)
        lam_e = lam[None, :] * np.exp(rng.normal(0.0, p.sigma_epoch, (E, P)))
        turns = 1 + rng.poisson(np.maximum(lam_e - 1.0, 0.0)[:, :, None], (E, P, n))
    else:
        # a prompt's probability of a direct answer: Beta with mean direct_frac (concentration 4)
        a = max(1e-3, 4.0 * p.direct_frac)
        b = max(1e-3, 4.0 * (1.0 - p.direct_frac))
        q = rng.beta(a, b, P)
        direct = rng.random((E, P, n)) < q[None, :, None]
        turns = np.where(direct, 1, 2 + rng.poisson(p.mean_turns_long - 2.0 if p.mean_turns_long > 2 else 0.0,
                                                    (E, P, n)))
    return np.minimum(turns, p.max_turns).astype(np.int64)


def _tool_latency(p: MultiTurnParams, rng: np.random.Generator, k: int) -> np.ndarray:
    body = p.tool_median_s * np.exp(rng.normal(0.0, p.tool_sigma, k))
    tail = p.tail_scale_s * (1.0 + rng.pareto(p.tail_alpha, k))
    lat: np.ndarray = np.minimum(np.where(rng.random(k) < p.tail_prob, tail, body), p.tool_timeout_s)
    return lat


def synth_multiturn(params: MultiTurnParams) -> Trace:
    """Tool-calling trajectories: a `Trace` (response_len = model tokens) with its `turns` table.

    A sample's level is log turn_median + prompt verbosity + epoch wobble; each turn draws around it.
    Turns past the `max_len` token cap are dropped and the last kept turn is cut to the cap (the loop
    stops the trajectory there), so `response_len <= max_len` and every turn has >= 1 token.
    """
    params.validate()
    p = params
    rng = np.random.default_rng(p.seed)
    P, E, n = p.prompts, p.epochs, p.n
    counts = _turn_counts(p, rng, (E, P, n)).ravel()
    verb = rng.normal(0.0, p.sigma_prompt, P)
    level = np.log(p.turn_median) + verb[None, :, None] + rng.normal(0.0, p.sigma_epoch, (E, P))[:, :, None]
    level = np.broadcast_to(level, (E, P, n)).ravel()
    rows = counts.size
    off = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    row_of = np.repeat(np.arange(rows), counts)
    first = np.zeros(int(off[-1]), dtype=bool)
    first[off[:-1]] = True
    log_tok = level[row_of] + rng.normal(0.0, p.sigma_turn, row_of.size) + np.where(
        first, np.log(p.first_turn_factor), 0.0)
    model = np.maximum(1, np.round(np.exp(np.minimum(log_tok, 30.0)))).astype(np.int64)
    # the token cap: cumulative tokens within the row; turns starting at/after the cap are dropped
    cum = np.cumsum(model) - np.repeat(np.r_[0, np.cumsum(model)[off[1:-1] - 1]], counts)
    start = cum - model
    keep = start < p.max_len
    model = np.where(cum > p.max_len, p.max_len - start, model)
    model, row_of = model[keep], row_of[keep]
    counts = np.bincount(row_of, minlength=rows).astype(np.int64)
    off = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    last = np.zeros(model.size, dtype=bool)
    last[off[1:] - 1] = True
    tt = np.round(p.tool_tokens_median * np.exp(rng.normal(0.0, p.tool_tokens_sigma, model.size)))
    tool_tokens = np.where(last, 0, np.clip(tt, 1, p.tool_tokens_cap)).astype(np.int64)
    tool_s = np.where(last, 0.0, _tool_latency(p, rng, model.size))
    log_prompt = np.log(p.prompt_median) + p.prompt_sigma * rng.standard_normal(P)
    prompt_len = np.clip(np.round(np.exp(log_prompt)), 1, _INT_MAX).astype(np.int64)
    width = max(6, len(str(P - 1)))
    names = np.array([f"p{i:0{width}d}" for i in range(P)])
    ep, pr, sm = np.meshgrid(np.arange(E), np.arange(P), np.arange(n), indexing="ij")
    turns = Turns(off, model, tool_tokens, tool_s)
    return Trace(names, pr.ravel().astype(np.int64), ep.ravel().astype(np.int64), sm.ravel().astype(np.int64),
                 prompt_len[pr.ravel()], turns.per_row(model).astype(np.int64), source="<synth-multiturn>",
                 turns=turns)
