"""Verifier stand-ins for the pool tests (module level, so spawned workers can import them)."""

from __future__ import annotations

import os
import time


def score(x: float) -> float:
    return x


def sleep_forever(x: float) -> float:
    while True:
        time.sleep(60)


def boom(x: float) -> float:
    raise ValueError(f"bad input {x}")


def die(x: float) -> float:
    os._exit(3)


def not_finite(x: float) -> float:
    return float("nan")


def pid(x: float) -> float:
    return float(os.getpid())
