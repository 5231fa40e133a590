"""Range checks for numbers that come from flags, config files and data files.

Every check rejects NaN and +-inf, bools posing as numbers and integers beyond what the readers of our
own files accept (int32 lengths, counts), and raises `InvalidValue` (one line, exit 2 in the CLI)
naming the value, its allowed range and what it got.
"""

from __future__ import annotations

import math
from typing import Any

from asp_npu.errors import InvalidValue

INT32_MAX = 2**31 - 1
SEED_MAX = 2**63 - 1


def _span(lo: float | None, hi: float | None, lo_open: bool = False) -> str:
    left = "(" if lo_open else "["
    return f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"


def check_int(what: str, value: Any, lo: int = 0, hi: int = INT32_MAX) -> int:
    """`value` as an int in [lo, hi]; anything else (float, bool, str, out of range) is refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValue(f"{what} must be an integer in {_span(lo, hi)} (got {value!r})")
    if not lo <= value <= hi:
        raise InvalidValue(f"{what} must be an integer in {_span(lo, hi)} (got {value})")
    return int(value)


def check_float(
    what: str, value: Any, lo: float | None = None, hi: float | None = None, lo_open: bool = False
) -> float:
    """`value` as a finite float within [lo, hi] (or (lo, hi] with `lo_open`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidValue(f"{what} must be a number in {_span(lo, hi, lo_open)} (got {value!r})")
    try:
        v = float(value)
    except OverflowError:  # an int beyond float range
        v = math.inf
    ok = math.isfinite(v) and (lo is None or (v > lo if lo_open else v >= lo)) and (hi is None or v <= hi)
    if not ok:
        raise InvalidValue(f"{what} must be a finite number in {_span(lo, hi, lo_open)} (got {value!r})")
    return v
