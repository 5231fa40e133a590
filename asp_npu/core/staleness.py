"""The bounded-policy-lag rule: who may be admitted to generation, and which groups a trainer step may take.

Definitions (ARCHITECTURE.md section 6). Counting is in whole GRPO groups. The trainer consumes
groups in positions 0, 1, 2, ...; position `p` belongs to trainer step `p // version_groups`, and
the weights version increases by one every `version_groups` consumed groups (one weight refresh).
A group generated with weights version `w` may be consumed by trainer step `s` only if
`s - w <= max_lag`, i.e. by its *deadline step* `w + max_lag`.

AReaL's `StalenessManager` admits new work while
`(max_lag + version + 1) * batch - (consumed + in_flight) > 0`. That is exact when groups complete in
admission order; with out-of-order completion (short samples overtake long ones) a trainer that takes
whatever finished first can push an old straggler past its deadline. We therefore keep the AReaL
formula (`areal_capacity`) and use its generalisation: an earliest-deadline ledger that checks, for every
deadline step `d`, that the outstanding groups due by `d` still fit in the positions left before
`(d + 1) * version_groups` (Hall's condition for interval windows). It equals the AReaL number when
completions are in order, and it guarantees the bound for any completion order ("prevent, don't
discard"): admission never over-commits, and a handout is refused (the trainer waits) rather than
let a due straggler miss its step.
"""

from __future__ import annotations

from collections.abc import Mapping


def areal_capacity(
    max_concurrent: int, running: int, max_lag: int, version: int, batch: int, consumed: int, in_flight: int
) -> int:
    """AReaL `StalenessManager.get_capacity`.

    `min(max_concurrent - running, (lag + v + 1) * batch - (consumed + in_flight))`.

    `in_flight` counts everything admitted and not yet consumed (generating or waiting in the queue).
    """
    return min(max_concurrent - running, (max_lag + version + 1) * batch - (consumed + in_flight))


def deadline_step(version: int, max_lag: int) -> int:
    """The last trainer step allowed to consume a group generated with weights `version`."""
    return version + max_lag


def lag_ok(step: int, version: int, max_lag: int) -> bool:
    """Trainer step `step` may consume a sample of weights `version` (the rule the whole pipeline keeps)."""
    return 0 <= step - version <= max_lag


def _due_counts(outstanding: Mapping[int, int]) -> list[tuple[int, int]]:
    """(deadline, cumulative outstanding with deadline <= it), ascending."""
    out, acc = [], 0
    for d in sorted(outstanding):
        acc += outstanding[d]
        out.append((d, acc))
    return out


def ledger_capacity(
    version: int, max_lag: int, version_groups: int, consumed: int, outstanding: Mapping[int, int]
) -> int:
    """How many more groups generated with weights `version` can be admitted without ever breaking the bound.

    `outstanding` maps deadline step -> groups admitted and not yet consumed. A new group's deadline is
    `d0 = version + max_lag`; it counts against every `d >= d0`, so the capacity is
    `min over d >= d0 of (d + 1) * version_groups - consumed - outstanding(deadline <= d)` (never below 0).
    """
    d0 = version + max_lag
    acc = 0
    cap: int | None = None
    for d in sorted(outstanding):
        if d > d0 and cap is None:
            cap = (d0 + 1) * version_groups - consumed - acc
        acc += outstanding[d]
        if d > d0:
            cap = min(cap, (d + 1) * version_groups - consumed - acc)  # type: ignore[type-var]
    if cap is None:
        cap = (d0 + 1) * version_groups - consumed - acc
    return max(0, cap)


def handout_need(
    version_groups: int, consumed: int, take: int, outstanding: Mapping[int, int]
) -> list[tuple[int, int]]:
    """For a handout of `take` groups at position `consumed`: [(d, k)] = >= k of them due by step d.

    After the handout, the groups still outstanding and due by `d` must fit before position
    `(d + 1) * version_groups`; whatever does not fit has to be in this handout.
    """
    after = consumed + take
    need = []
    for d, due in _due_counts(outstanding):
        k = due - ((d + 1) * version_groups - after)
        if k > 0:
            need.append((d, k))
    return need


def handout_feasible(chosen_deadlines: list[int], need: list[tuple[int, int]]) -> bool:
    """Whether a handout whose groups have these deadline steps satisfies every `(d, k)` of `handout_need`."""
    return all(sum(1 for x in chosen_deadlines if x <= d) >= k for d, k in need)


# ------------------------------------------------------------------------------------ partial rollout
# With partial rollout a sequence keeps decoding across weight refreshes, so its tokens carry several
# behaviour versions. A group's *newest* version is the weights its sequences decode with now (after
# every refresh they see); its *oldest* is the version of its first token. Admission and handout
# count the lag from the newest version (`max_lag`), and the oldest token is held to the looser
# `max_token_lag`, so no token's staleness is unbounded. Without partial rollout both are the version
# the group started with (AReaL's oldest-token rule). A group admitted under version `v` that has not
# generated a token when weights refresh is stamped with the version it starts under (`restamp` with
# oldest = newest): it has no older token.

TOKEN_LAG_FACTOR = 4  # partial rollout's default `max_token_lag`: this many times `max_lag`


def token_lag_bound(partial_rollout: bool, max_token_lag: int | None, max_lag: int) -> int | None:
    """The bound on the oldest token's lag: None without partial rollout (it is `max_lag` then)."""
    if not partial_rollout:
        return None
    return TOKEN_LAG_FACTOR * max_lag if max_token_lag is None else max_token_lag


def group_deadline(oldest: int, newest: int, max_lag: int, max_token_lag: int | None = None) -> int:
    """The last trainer step that may consume a group whose tokens span weights `oldest`..`newest`."""
    d = newest + max_lag
    return d if max_token_lag is None else min(d, oldest + max_token_lag)


def restamp_deadline(
    oldest: int, newest: int, version: int, started: bool, max_lag: int, max_token_lag: int | None
) -> tuple[int, int, int]:
    """(oldest, newest, deadline) after weights `version` reach a group in flight.

    Not started: the group has no token yet, so both versions become `version`. Started: only
    partial rollout (`max_token_lag` set) moves the newest version; without it nothing changes.
    The deadline never moves earlier, so a ledger that held before still holds.
    """
    if version < newest:
        raise ValueError(f"weights version {version} is older than the group's newest {newest}")
    if not started:
        oldest = newest = version
    elif max_token_lag is not None:
        newest = version
    return oldest, newest, group_deadline(oldest, newest, max_lag, max_token_lag)


def token_lags_ok(step: int, oldest: int, newest: int, max_lag: int, max_token_lag: int | None) -> bool:
    """Step `step` may consume a group: its newest tokens within `max_lag`, its oldest within
    `max_token_lag` (both `max_lag` without partial rollout)."""
    bound = max_lag if max_token_lag is None else max_token_lag
    return lag_ok(step, newest, max_lag) and 0 <= step - oldest <= bound


def reconcile_stamp(
    stamp: tuple[int, int], recorded: tuple[int, int], partial: bool
) -> list[tuple[int, bool]]:
    """The `restamp`s (version, started) that move a finished group's stamp (oldest, newest) to the
    versions its tokens were recorded with (oldest, newest), where a refresh reached its instance before
    the group did. Only later versions: a stamp never moves earlier (the ledger keeps its guarantee)."""
    out: list[tuple[int, bool]] = []
    oldest, newest = stamp
    if recorded[0] > oldest and recorded[0] >= newest:  # no token from the stamped weights: it started later
        out.append((recorded[0], False))
        newest = recorded[0]
    if partial and recorded[1] > newest:
        out.append((recorded[1], True))
    return out
