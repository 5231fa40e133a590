"""The rollout engine protocol: what an instance needs from an inference engine, and nothing more.

Why a protocol: the instance actor, the calibration command and the benchmarks are written against
this interface, so the vLLM engine (CPU build, vllm-ascend on NPU, CUDA) is one implementation and
nothing above it imports vLLM. All methods are coroutines on one event loop; `LoopThread` gives
synchronous callers (tests, CLIs) a private loop in a background thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from asp_npu.errors import UserError
from asp_npu.types import PromptItem, Trajectory

if TYPE_CHECKING:
    from asp_npu.data.rewards import RewardSpec

T = TypeVar("T")


class PromptTooLongError(UserError):
    """A prompt that leaves no room for a single generated token within the model's context."""


@dataclass(frozen=True)
class SamplingSettings:
    """Per-request sampling; `n` samples of one prompt form a GRPO group."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 / 0: every token
    min_p: float = 0.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None  # per-sample seeds are derived from it, prompt_id and sample_idx
    ignore_eos: bool = False  # benchmarks/calibration: force exactly max_tokens
    # stream every token back (measures t_first_token). Off in the pipeline: streaming each token of
    # every sequence through the front-end costs a core-bound instance ~45% of its throughput
    stream: bool = False
    # ReMax: one extra greedy response per group, its reward recorded on every sample as
    # `Trajectory.reward_baseline` (the instance generates it; the engine ignores this flag)
    greedy_baseline: bool = False

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_tokens < 1:
            raise UserError(
                f"sampling: n and max_tokens must be >= 1 (got n={self.n}, max_tokens={self.max_tokens})"
            )
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise UserError(
                f"sampling: need temperature >= 0 and 0 < top_p <= 1 (got {self.temperature}, {self.top_p})"
            )
        if self.top_k < -1 or not 0 <= self.min_p <= 1:
            raise UserError(f"sampling: need top_k >= -1 and 0 <= min_p <= 1 (got {self.top_k}, "
                            f"{self.min_p})")


@dataclass(frozen=True)
class MultiTurnSpec:
    """Config `multi_turn` as the rollout needs it (names: MindSpeed-RL rl_config / verl multi_turn)."""

    tools: tuple[str, ...] = ("calculator",)  # registered tool names the model may call
    max_assistant_turns: int = 4
    max_tool_calls: int = 3  # per trajectory
    max_parallel_calls: int = 1  # per assistant turn; further calls are answered with an error
    max_total_response_length: int = 0  # tokens of the whole response, model + tools (0 = max_tokens)
    max_tool_response_length: int = 256  # characters of one tool output
    tool_response_truncate_side: str = "middle"
    format: str = "hermes"
    tool_timeout_s: float = 10.0


@dataclass
class EngineSettings:
    """How to build an engine; mirrors `generate_config` (MindSpeed-RL names where they exist)."""

    model_path: str
    dtype: str = "float32"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.8  # NPU/CUDA only; CPU uses VLLM_CPU_KVCACHE_SPACE
    seed: int = 0
    # vLLM weight-transfer engine ("gloo", "nccl", "ipc"; "auto": `device.weight_transfer_backend` for this
    # platform, disaggregated; "" builds none and leaves only the object-store refresh)
    weight_transfer: str = "auto"
    extra: dict[str, Any] = field(default_factory=dict)  # passed through to the engine's args
    reward: RewardSpec | None = None  # how samples are scored (config `reward`; None = the data_source rule)
    multi_turn: MultiTurnSpec | None = None  # tool-calling rollouts (config `multi_turn`); None = one turn


@dataclass
class RefreshReport:
    """What one weight_refresh cost, split so slow serialisation and slow loading are told apart."""

    version: int
    load_s: float  # inside the worker: reload_weights
    total_s: float  # serialise + transfer + load + prefix-cache reset
    drain_s: float  # waiting for in-flight sequences of the old version
    num_bytes: int
    frozen_s: float = 0.0  # weight-transfer engine: running sequences stopped (drain: the whole refresh)
    transfer_s: float = 0.0  # weight-transfer engine: the update_weights RPC (rest of receive + load)
    t_wall_end: float = 0.0  # time.time() when frozen running sequences resumed (0: none were frozen)


class RolloutEngine(Protocol):
    """One inference engine. Trajectories carry the weights version they were generated with."""

    policy_version: int
    max_model_len: int

    def encode_prompt(self, item: PromptItem) -> list[int]: ...

    async def generate(
        self, item: PromptItem, sampling: SamplingSettings, sample_indices: Sequence[int] | None = None
    ) -> list[Trajectory]: ...

    async def refresh_weights(
        self, weights: bytes | Mapping[str, Any], version: int, drain: bool = True
    ) -> RefreshReport: ...

    async def pause(self) -> None: ...

    async def resume(self) -> None: ...

    def num_in_flight(self) -> int: ...

    async def wait_admitting(self) -> None: ...

    def shutdown(self) -> None: ...


class ActivityLog:
    """Busy/idle intervals (busy = at least one sequence in flight) and per-sequence events.

    Wall-clock `time.time()` so intervals of instances in different processes compare directly.
    """

    def __init__(self) -> None:
        self.in_flight = 0
        self.busy: list[tuple[float, float]] = []
        self._busy_since: float | None = None
        self.events: list[dict[str, Any]] = []

    def start(self, prompt_id: str, sample_idx: int, **extra: Any) -> None:
        now = time.time()
        if self.in_flight == 0:
            self._busy_since = now
        self.in_flight += 1
        self.events.append(
            {"event": "start", "t": now, "prompt_id": prompt_id, "sample_idx": sample_idx, **extra}
        )

    def finish(self, prompt_id: str, sample_idx: int, **extra: Any) -> None:
        now = time.time()
        self.in_flight -= 1
        self.events.append(
            {"event": "finish", "t": now, "prompt_id": prompt_id, "sample_idx": sample_idx, **extra}
        )
        if self.in_flight == 0 and self._busy_since is not None:
            self.busy.append((self._busy_since, now))
            self._busy_since = None

    def busy_intervals(self) -> list[tuple[float, float]]:
        """Closed intervals, plus the open one (ending now) if sequences are running."""
        if self._busy_since is None:
            return list(self.busy)
        return [*self.busy, (self._busy_since, time.time())]


class LoopThread:
    """A private asyncio loop in a daemon thread, for driving an async engine from sync code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="asp-engine-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self, timeout_s: float = 10.0) -> None:
        """Cancel what is still pending on the loop, then stop it. Never raises: a loop still blocked
        in a call after `timeout_s` (an engine being built when SIGTERM/SIGINT came) is left to its
        daemon thread."""
        if self.loop.is_running():
            try:
                self.run(_cancel_pending(), timeout=timeout_s)
            except TimeoutError:
                return
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=timeout_s)
        if not self.loop.is_running():
            self.loop.close()


async def _cancel_pending() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
