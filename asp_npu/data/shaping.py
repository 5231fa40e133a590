"""DAPO's reward shaping and dynamic sampling rules, as pure functions the queue actor applies.

Overlong reward shaping (DAPO, Yu et al. 2025, eq. 13; MindSpeed-RL `overlong_buffer_*`, verl
`reward_model.overlong_buffer.{enable,len,penalty_factor}`): with response cap `L_max` (max_tokens) and
buffer `L_buf`, a response of `|y|` tokens gets

    0                                        if |y| <= L_max - L_buf
    -(|y| - (L_max - L_buf)) / L_buf * f     if L_max - L_buf < |y| <= L_max

added to its reward (`f` = penalty factor; a response cut at L_max gets -f). The penalty is a soft,
length-proportional signal instead of a cliff at truncation.

Dynamic sampling (DAPO's "filter groups"): a GRPO group whose final rewards are all equal has zero
advantage everywhere and teaches nothing; it is filtered before the trainer and more prompts are
generated so every minibatch keeps `mini_batch_size` samples. `filter_groups_max_batches` caps the
generation: a run filters at most `(max_batches - 1) x global batch x train_iters` groups (verl's cap is
per training batch; summed over the run it is the same number of generation batches). Past the cap,
equal-reward groups are trained (zero advantage), so a run never stalls on a task it cannot learn.

What "all equal" is judged on (`rl_config.filter_groups_metric`):
- `reward` (default): the final reward the advantages use, after the overlong penalty (verl `seq_reward`).
  A group of right answers of different lengths past the buffer differs, and is trained.
- `score`: the verifiers' weighted sum before the overlong penalty (verl `score`, and verl `acc`, which
  for its rule scores is the same verdict: `math_dapo`'s acc is its +-1 score's right/wrong). The same
  group of right answers is filtered: it carries only the length signal.
- a verifier's name from `reward.verifier_function`: that verifier's own (unweighted) score, recorded per
  trajectory where the reward is computed (`Trajectory.scores`), as MindSpeed-RL's `filter_groups_metric:
  acc_for_dapo` filters on `acc_for_dapo` alone while the reward may also sum format verifiers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DapoShaping:
    """The queue actor's DAPO settings (from `rl_config`), frozen at start."""

    filter_groups: bool = False
    filter_budget: int | None = None  # groups a run may filter (None: no cap)
    filter_metric: str = "reward"  # reward | score | a verifier's name (module docstring)
    overlong: bool = False
    max_tokens: int = 0
    overlong_buffer: int = 0
    penalty_factor: float = 1.0


def overlong_penalty(response_len: int, max_tokens: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong penalty (<= 0) of a response of `response_len` tokens (module docstring)."""
    if buffer <= 0:
        return 0.0
    exceed = response_len - (max_tokens - buffer)
    return min(-exceed / buffer * factor, 0.0)


def shaped_rewards(rewards: Sequence[float], lengths: Sequence[int], s: DapoShaping) -> list[float]:
    """Rewards with the overlong penalty added when `s.overlong` (else unchanged)."""
    if not s.overlong:
        return [float(r) for r in rewards]
    return [float(r) + overlong_penalty(n, s.max_tokens, s.overlong_buffer, s.penalty_factor)
            for r, n in zip(rewards, lengths, strict=True)]


def equal_rewards(rewards: Sequence[float]) -> bool:
    """All rewards of a group equal (zero advantage): what dynamic sampling filters."""
    return len({float(r) for r in rewards}) <= 1


REWARD, SCORE = "reward", "score"
FILTER_METRICS = (REWARD, SCORE)  # besides the name of a verifier the reward sums


def filter_values(metric: str, shaped: Sequence[float], unshaped: Sequence[float],
                  scores: Sequence[Mapping[str, float]]) -> list[float]:
    """A group's values of the filter metric: the shaped rewards, the unshaped ones, or each sample's
    score from the verifier `metric` (a sample without it: KeyError, the config check prevents it)."""
    if metric == REWARD:
        return [float(r) for r in shaped]
    if metric == SCORE:
        return [float(r) for r in unshaped]
    return [float(s[metric]) for s in scores]


def filter_budget(max_batches: int, window: int, iterations: int) -> int | None:
    """Groups a run may filter: `(max_batches - 1) x window x iterations`; None when `max_batches <= 0`."""
    return None if max_batches <= 0 else (max_batches - 1) * window * iterations


def dapo_shaping(cfg: object, window: int, iterations: int) -> DapoShaping:
    """The DAPO settings of a config (`asp_npu.config.Config`) for a run of `iterations` windows."""
    rl = cfg.rl_config  # type: ignore[attr-defined]
    return DapoShaping(
        filter_groups=bool(rl.drop_equal_reward_groups),
        filter_budget=filter_budget(rl.filter_groups_max_batches, window, iterations),
        filter_metric=str(rl.filter_groups_metric),
        overlong=bool(rl.overlong_buffer_enable),
        max_tokens=cfg.generate_config.sampling_config.max_tokens,  # type: ignore[attr-defined]
        overlong_buffer=rl.overlong_buffer, penalty_factor=rl.overlong_buffer_penalty_factor)
