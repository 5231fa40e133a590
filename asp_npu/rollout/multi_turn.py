"""Multi-turn, tool-calling rollouts: one trajectory = assistant turns interleaved with tool turns.

The loop of one sample (`generate_one`):
1. an assistant turn is one vLLM request on the context so far (prompt + every earlier turn), at most
   the tokens left of `max_total_response_length` (and of the model's context);
2. its text is parsed for tool calls (`data/tool_format.py`, Hermes/Qwen `<tool_call>{...}</tool_call>`);
   none -> the trajectory ends (`stop`); a cap reached (`max_assistant_turns`, `max_tool_calls`) -> it
   ends with that cap as its `finish_reason`;
3. up to `max_parallel_calls` calls run concurrently (`tools.call_tool`, each within `tool_timeout_s`;
   a failure is an error string the model reads, counted in `tool_failures`), while the sample holds no
   decode slot: no vLLM request, and the instance's admission slot is given back (`pause`/`resume`);
4. the outputs, each cut to `max_tool_response_length` characters, are appended as the chat template's
   tool turn; its tokens carry `loss_mask` 0 and logprob 0 (not sampled, never trained), then step 1.

Behaviour versions: each turn records its own change points (a weight refresh in flight moves them
inside a turn, `vllm_engine.SeqVersions`), shifted to the turn's offset in the response; tool tokens
belong to the segment before them (they carry no gradient, their version is never used). A refresh while
the sample waits on a tool counts it as running (its next turn takes the new weights), so the lag ledger
moves as for a decoding sample. The reward scores the model's own turns only (tool outputs cannot earn it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from asp_npu.data.tool_format import ToolCall, parse_tool_calls, tool_turn_text, truncate
from asp_npu.rollout.engine import MultiTurnSpec, PromptTooLongError, SamplingSettings
from asp_npu.rollout.tools import ToolResult, call_tool
from asp_npu.types import PromptItem, Trajectory


@dataclass
class Transcript:
    """A trajectory being built, turn by turn."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    changes: list[list[int]] = field(default_factory=list)
    model_text: list[str] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    tool_s: float = 0.0
    finish: str = "stop"
    first: Trajectory | None = None

    def add_turn(self, turn: Trajectory, text: str) -> None:
        off = len(self.tokens)
        for lo, v in turn.changes():
            if not self.changes or self.changes[-1][1] != v:
                self.changes.append([off + lo, v])
        self.tokens += turn.response_token_ids
        self.logprobs += turn.logprobs
        self.mask += [1] * turn.response_len
        self.model_text.append(text)
        self.turns += 1
        self.finish = turn.finish_reason
        self.first = self.first or turn

    def add_tool_turn(self, ids: list[int]) -> None:
        self.tokens += ids
        self.logprobs += [0.0] * len(ids)
        self.mask += [0] * len(ids)


Hook = Callable[[], Awaitable[None]] | None


async def generate_one(engine: Any, item: PromptItem, sampling: SamplingSettings, idx: int,
                       spec: MultiTurnSpec, pause: Hook = None, resume: Hook = None) -> Trajectory:
    """Sample `idx` of `item` as a multi-turn trajectory on `engine` (a VLLMEngine); `pause`/`resume`
    give the sample's decode slot back while it waits on tools and take it again before the next turn."""
    prompt = engine.encode_prompt(item)
    if len(prompt) >= engine.max_model_len:
        raise PromptTooLongError(f"prompt {item.prompt_id}: {len(prompt)} tokens does not fit the model "
                                 f"context ({engine.max_model_len} tokens)")
    budget = spec.max_total_response_length or sampling.max_tokens
    turn_item = replace(item, ground_truth=None)  # turns are scored once, at the end
    tr = Transcript()
    t_submitted = time.time()
    engine.track(item.prompt_id, idx)
    try:
        while True:
            room = min(budget - len(tr.tokens), engine.max_model_len - len(prompt) - len(tr.tokens))
            if room <= 0:
                tr.finish = "length"
                break
            turn = await engine.sample_turn(turn_item, prompt + tr.tokens, idx,
                                            replace(sampling, max_tokens=room))
            text = engine.tokenizer.decode(turn.response_token_ids, skip_special_tokens=True)
            tr.add_turn(turn, text)
            calls = parse_tool_calls(text, spec.format) if turn.finish_reason == "stop" else []
            if not calls or _capped(tr, spec):
                break
            engine.between_turns(item.prompt_id, idx)
            ids = await _tool_turn(engine, tr, calls, spec, pause, resume)
            used = len(tr.tokens) + len(ids)
            if used >= budget or len(prompt) + used >= engine.max_model_len:
                tr.finish = "length"  # no room for the tool output and a turn after it
                break
            tr.add_tool_turn(ids)
    finally:
        engine.untrack(item.prompt_id, idx)
    reward, failures = await engine.score(item, "\n".join(tr.model_text))
    return _trajectory(item, idx, prompt, tr, reward, failures, t_submitted)


def _capped(tr: Transcript, spec: MultiTurnSpec) -> bool:
    """A call the caps forbid ends the trajectory with the cap as its finish reason."""
    if tr.turns >= spec.max_assistant_turns:
        tr.finish = "max_assistant_turns"
    elif tr.tool_calls >= spec.max_tool_calls:
        tr.finish = "max_tool_calls"
    else:
        return False
    return True


async def _tool_turn(engine: Any, tr: Transcript, calls: list[ToolCall], spec: MultiTurnSpec,
                     pause: Hook, resume: Hook) -> list[int]:
    """Run the turn's calls (slot given back meanwhile); the tool turn's token ids."""
    allowed = min(spec.max_parallel_calls, spec.max_tool_calls - tr.tool_calls)
    if pause is not None:
        await pause()
    t0 = time.perf_counter()
    try:
        results = await asyncio.gather(*(_call(c, spec, k < allowed) for k, c in enumerate(calls)))
    finally:
        tr.tool_s += time.perf_counter() - t0  # the calls only (not the wait for a slot after them)
        if resume is not None:
            await resume()
    tr.tool_calls += min(len(calls), allowed)
    tr.tool_failures += sum(1 for r in results if not r.ok)
    outs = [truncate(r.text, spec.max_tool_response_length, spec.tool_response_truncate_side)
            for r in results]
    return list(engine.tokenizer.encode(tool_turn_text(engine.tokenizer, outs), add_special_tokens=False))


async def _call(call: ToolCall, spec: MultiTurnSpec, allowed: bool) -> ToolResult:
    if call.error:
        return ToolResult(f"error: {call.error}", "bad_arguments")
    if not allowed:
        return ToolResult(f"error: more than {spec.max_parallel_calls} tool call(s) in one turn", "refused")
    if call.name not in spec.tools:
        return ToolResult(f"error: no tool named '{call.name}'", "unknown_tool")
    return await call_tool(call.name, call.arguments, spec.tool_timeout_s)


def _trajectory(item: PromptItem, idx: int, prompt: list[int], tr: Transcript, reward: float,
                failures: int, t_submitted: float) -> Trajectory:
    first = tr.first
    assert first is not None
    changes = tr.changes or [[0, first.policy_version]]
    return Trajectory(
        prompt_id=item.prompt_id, sample_idx=idx, prompt_token_ids=list(prompt),
        response_token_ids=tr.tokens, logprobs=tr.logprobs, finish_reason=tr.finish, reward=reward,
        reward_failures=failures, policy_version=changes[0][1], policy_version_last=changes[-1][1],
        version_changes=changes, epoch=int(item.meta.get("epoch", 0)), t_submitted=t_submitted,
        t_first_token=first.t_first_token, t_finished=time.time(), loss_mask=tr.mask,
        turns=tr.turns, tool_calls=tr.tool_calls, tool_failures=tr.tool_failures, tool_s=tr.tool_s,
    )


def tool_names_from_yaml(path: str) -> tuple[str, ...]:
    """The tool names of a MindSpeed-RL / verl tools YAML (`tools: [{tool_schema: {function: {name}}}]`)."""
    from pathlib import Path

    import yaml

    from asp_npu.errors import UserError

    try:
        doc = yaml.safe_load(Path(path).read_text())
        names = tuple(str(t["tool_schema"]["function"]["name"]) for t in doc["tools"])
    except OSError as exc:
        raise UserError(f"multi_turn.tool_config_path: cannot read {path} ({type(exc).__name__})") from None
    except (KeyError, TypeError, yaml.YAMLError):
        raise UserError(f"multi_turn.tool_config_path: {path} is not a tools YAML "
                        "(tools: - tool_schema: function: name: ...)") from None
    return names


def multi_turn_spec(mt: Any) -> MultiTurnSpec | None:
    """Config `multi_turn` -> the rollout's spec (None when off); every tool must be registered."""
    from asp_npu.rollout.tools import get_tool

    if not mt.enable:
        return None
    names = tool_names_from_yaml(mt.tool_config_path) if mt.tool_config_path else tuple(mt.tools)
    for name in names:
        get_tool(name)  # a clear error naming the unknown tool, before any engine starts
    return MultiTurnSpec(
        tools=names, max_assistant_turns=mt.max_assistant_turns, max_tool_calls=mt.max_tool_calls,
        max_parallel_calls=mt.max_parallel_calls, max_total_response_length=mt.max_total_response_length,
        max_tool_response_length=mt.max_tool_response_length,
        tool_response_truncate_side=mt.tool_response_truncate_side, format=mt.format,
        tool_timeout_s=mt.tool_timeout_s)


def multi_turn_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Per trainer step: tool calls per trajectory, their success rate, assistant turns, tool share."""
    n = max(1, len(trajs))
    calls = sum(t.tool_calls for t in trajs)
    ok = calls - sum(t.tool_failures for t in trajs)
    tool_tokens = sum(len(t.loss_mask) - sum(t.loss_mask) for t in trajs)
    return {
        "multi_turn/tool_calls_per_traj": calls / n,
        "multi_turn/tool_success_rate": ok / calls if calls else 0.0,
        "multi_turn/turns_mean": sum(t.turns for t in trajs) / n,
        "multi_turn/tool_token_share": tool_tokens / max(1, sum(t.response_len for t in trajs)),
        "multi_turn/calling_traj_share": sum(1 for t in trajs if t.tool_calls) / n,
    }
