"""Core records that cross process boundaries (Ray actors, files).

Plain dataclasses of Python scalars/lists so they pickle cheaply through Ray and serialise to JSON.
The plan types (`DispatchUnit`, `RolloutPlan`) live in `asp_npu.schedule.plan`; the records the
simulator and the pipeline share (`GroupKey`, `Unit`, `Arrival`, `Minibatch`) in `asp_npu.core.records`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class PromptItem:
    """One prompt; a GRPO group is this prompt x n samples."""

    prompt_id: str
    prompt_token_ids: list[int] | None = None
    text: str | None = None
    ground_truth: Any = None  # what the reward function compares against
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LengthEstimate:
    """A predicted response-length distribution for one prompt (tokens)."""

    prompt_id: str
    mean: float
    q50: float
    q90: float
    source: str  # "history" | "prompt-len" | "population" | "oracle"


@dataclass
class Trajectory:
    """One generated sample, with everything the trainer and the bubble accounting need."""

    prompt_id: str
    sample_idx: int
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    logprobs: list[float]  # behaviour logprobs of the sampled tokens (temperature-processed)
    finish_reason: str
    reward: float
    policy_version: int  # weights version of its first token (the oldest: what the lag bound counts)
    instance: int = -1
    epoch: int = 0
    t_submitted: float = 0.0
    t_first_token: float = 0.0  # 0.0 = not measured (only streamed requests see their first token)
    t_finished: float = 0.0
    policy_version_last: int = -1  # version of its last token (> policy_version after an in-flight refresh)
    # every token's behaviour version, as change points [[first token index, weights version], ...]
    # (first = policy_version; empty = all tokens policy_version); see `token_versions`
    version_changes: list[list[int]] = field(default_factory=list)
    reward_failures: int = 0  # verifier calls of its reward that timed out or failed (each scored 0)
    # each verifier's own (unweighted) score (the reward is their weighted sum; DAPO's filter metric)
    scores: dict[str, float] = field(default_factory=dict)
    # per response token, 1 = the model's own token (trained), 0 = not trained (a tool's output in a
    # multi-turn trajectory); empty = every response token is the model's
    loss_mask: list[int] = field(default_factory=list)
    turns: int = 1  # assistant turns (multi-turn rollouts: asp_npu.rollout.multi_turn)
    tool_calls: int = 0  # tool calls run
    tool_failures: int = 0  # of which failed (timeout, crash, output cap, bad or unknown call)
    tool_s: float = 0.0  # seconds its tool calls took (the trajectory predictor learns them per prompt)
    # ReMax (`adv_estimator: remax`): the reward of one greedy (temperature 0) response to the same
    # prompt, generated beside the group, scored by the same reward function and never trained on;
    # the same on every trajectory of a group. None = no baseline was generated
    reward_baseline: float | None = None
    baseline_len: int = 0  # response tokens of that greedy response (rollout/baseline_tokens)

    @property
    def response_len(self) -> int:
        return len(self.response_token_ids)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def changes(self) -> list[list[int]]:
        """Change points of the behaviour version, never empty."""
        return [list(p) for p in self.version_changes] or [[0, self.policy_version]]

    def token_versions(self) -> list[int]:
        """The weights version each response token was sampled with."""
        pts = self.changes()
        out: list[int] = []
        for k, (lo, v) in enumerate(pts):
            hi = pts[k + 1][0] if k + 1 < len(pts) else self.response_len
            out += [v] * max(0, hi - lo)
        return out

    def version_segments(self) -> list[tuple[int, int]]:
        """(weights version, tokens sampled with it) in generation order."""
        pts = self.changes()
        return [(v, (pts[k + 1][0] if k + 1 < len(pts) else self.response_len) - lo)
                for k, (lo, v) in enumerate(pts)]


@dataclass
class TrainBatch:
    """A complete minibatch of whole GRPO groups handed to the trainer for one step."""

    trajectories: list[Trajectory]
    group_size: int
    step: int = -1  # trainer step that will consume it
    advantages: list[list[float]] | None = None  # per response token (PPO's GAE); None = the estimator's

    @property
    def num_samples(self) -> int:
        return len(self.trajectories)

    @property
    def versions(self) -> list[int]:
        return [t.policy_version for t in self.trajectories]
