"""Multi-turn rollouts without an engine: a scripted engine stands in for vLLM so the loop's record is
checked exactly -- loss masks (tool tokens carry no gradient through the real loss), per-token behaviour
versions across turns, the caps, tool failures that leave the trajectory going, the slot given back."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from asp_npu.config import Config
from asp_npu.data.tool_format import parse_tool_calls, render_tool_call, tool_turn_text, truncate
from asp_npu.rollout import tools
from asp_npu.rollout.engine import SamplingSettings
from asp_npu.rollout.multi_turn import MultiTurnSpec, generate_one, multi_turn_metrics, multi_turn_spec
from asp_npu.trainer.batching import agg_norm, batch_to_samples, make_micro_batches
from asp_npu.trainer.losses import LossConfig, policy_loss
from asp_npu.types import PromptItem, TrainBatch, Trajectory

EOS = 1


class CharTokenizer:
    eos_token_id, eos_token, chat_template = EOS, "", None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i != EOS)


class ScriptedEngine:
    """Answers each turn from `script`; `versions[k]` = the weights version(s) of turn k: an int, or
    change points within the turn. Records what the loop told it."""

    max_model_len = 4096

    def __init__(self, script: list[str], versions: list[object] | None = None, tokenizer=None) -> None:
        self.script, self.versions = list(script), list(versions or [])
        self.tokenizer = tokenizer or CharTokenizer()
        self.contexts: list[list[int]] = []
        self.log: list[str] = []

    def encode_prompt(self, item: PromptItem) -> list[int]:
        return self.tokenizer.encode(item.text or "", add_special_tokens=False)

    def track(self, pid: str, idx: int) -> None:
        self.log.append("track")

    def untrack(self, pid: str, idx: int) -> None:
        self.log.append("untrack")

    def between_turns(self, pid: str, idx: int) -> None:
        self.log.append("between")

    async def sample_turn(self, item, ids, idx, sampling: SamplingSettings) -> Trajectory:
        assert item.ground_truth is None  # turns are not scored
        self.contexts.append(list(ids))
        text = self.script.pop(0)
        toks = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        finish = "stop"
        if len(toks) > sampling.max_tokens:
            toks, finish = toks[: sampling.max_tokens], "length"
        v = self.versions.pop(0) if self.versions else 0
        changes = [[0, v]] if isinstance(v, int) else v
        return Trajectory(item.prompt_id, idx, list(ids), toks, [-0.5] * len(toks), finish, 0.0,
                          changes[0][1], version_changes=changes)

    async def score(self, item: PromptItem, response: str) -> tuple[float, int]:
        final = response.rsplit("</tool_call>", 1)[-1]
        return (1.0 if str(item.ground_truth) in final else 0.0), 0


A, B = 12345678901234, 98765432109876
CALL = render_tool_call("calculator", {"expression": f"{A}*{B}"})
ITEM = PromptItem("p", text=f"What is {A}*{B}?", ground_truth=str(A * B))
SAMPLING = SamplingSettings(max_tokens=400)


DEFAULT = MultiTurnSpec()


def run(engine, spec=DEFAULT, item=ITEM, **kw) -> Trajectory:
    return asyncio.run(generate_one(engine, item, SAMPLING, 0, spec, **kw))


def test_tool_output_is_in_the_context_and_masked_out():
    eng = ScriptedEngine([CALL, f"It is {A * B}."])
    t = run(eng)
    tool_text = tool_turn_text(eng.tokenizer, [str(A * B)])
    n1, n_tool = len(CALL) + 1, len(tool_text)
    assert (t.turns, t.tool_calls, t.tool_failures, t.finish_reason, t.reward) == (2, 1, 0, "stop", 1.0)
    assert t.tool_s > 0  # the seconds it waited on the calculator (the trajectory predictor learns them)
    assert t.loss_mask == [1] * n1 + [0] * n_tool + [1] * (t.response_len - n1 - n_tool)
    masked = [tok for tok, m in zip(t.response_token_ids, t.loss_mask, strict=True) if not m]
    assert eng.tokenizer.decode(masked) == tool_text and str(A * B) in tool_text
    assert t.logprobs[n1:n1 + n_tool] == [0.0] * n_tool and -0.5 in t.logprobs[n1 + n_tool:]
    # the second turn saw prompt + first turn (with its EOS) + the tool turn
    assert eng.contexts[1] == eng.encode_prompt(ITEM) + t.response_token_ids[: n1 + n_tool]
    assert eng.log == ["track", "between", "untrack"]


def test_tool_tokens_carry_no_gradient_through_the_policy_loss():
    eng = ScriptedEngine([CALL, f"It is {A * B}.", CALL, "It is 7."])
    trajs = [run(eng), run(eng)]
    trajs[1].sample_idx = 1
    samples, _ = batch_to_samples(TrainBatch(trajs, group_size=2), drop_equal_groups=False)
    cfg = Config()
    norm = agg_norm(samples, cfg)
    for mb in make_micro_batches(samples, 2):
        logp = torch.full(mb["mask"].shape, -0.5, requires_grad=True)
        loss, _ = policy_loss(logp, logp.detach(), mb["behav"], mb["adv"], mb["mask"], LossConfig(), norm,
                              resp_len=mb["resp_len"])
        loss.backward()
        for j, idx in enumerate(mb["index"].tolist()):
            t = trajs[idx]
            lo = len(t.prompt_token_ids) - 1
            g = logp.grad[j, lo:lo + t.response_len]
            mask = torch.tensor(t.loss_mask, dtype=torch.bool)
            assert torch.all(g[~mask] == 0)  # tool output: no gradient
            assert torch.all(g[mask] != 0)  # every model token: a gradient
            assert int(mb["resp_len"][j]) == sum(t.loss_mask)


def test_per_token_versions_across_turns():
    # turn 1 on version 3; weights 4 arrive while it waits on the tool; turn 2 changes 4 -> 5 mid-turn
    eng = ScriptedEngine([CALL, "It is 1234567890."], versions=[3, [[0, 4], [5, 5]]])
    t = run(eng)
    n1 = len(CALL) + 1
    n_tool = len(tool_turn_text(eng.tokenizer, [str(A * B)]))
    assert t.version_changes == [[0, 3], [n1 + n_tool, 4], [n1 + n_tool + 5, 5]]
    assert (t.policy_version, t.policy_version_last) == (3, 5)
    versions = t.token_versions()
    assert versions[: n1 + n_tool] == [3] * (n1 + n_tool)  # the tool turn keeps the version before it
    assert versions[n1 + n_tool:] == [4] * 5 + [5] * (t.response_len - n1 - n_tool - 5)


def test_caps_end_the_trajectory_with_their_reason():
    t = run(ScriptedEngine([CALL, CALL, CALL]), MultiTurnSpec(max_tool_calls=1))
    assert (t.finish_reason, t.turns, t.tool_calls) == ("max_tool_calls", 2, 1)
    t = run(ScriptedEngine([CALL, CALL]), MultiTurnSpec(max_assistant_turns=1))
    assert (t.finish_reason, t.turns, t.tool_calls) == ("max_assistant_turns", 1, 0)
    budget = len(CALL) + 1 + len(tool_turn_text(CharTokenizer(), [str(A * B)])) + 20
    t = run(ScriptedEngine([CALL, "x" * 500]), MultiTurnSpec(max_total_response_length=budget))
    assert (t.finish_reason, t.turns, t.response_len) == ("length", 2, budget)
    t = run(ScriptedEngine([CALL]), MultiTurnSpec(max_total_response_length=len(CALL) + 5))
    assert (t.finish_reason, t.turns, t.response_len) == ("length", 1, len(CALL) + 1)  # no room: output


def test_failing_tools_are_answered_with_errors_and_the_trajectory_goes_on():
    async def hang(**_: object) -> str:
        await asyncio.sleep(30)
        return ""

    tools.register("t_hang", hang)
    calls = (render_tool_call("t_hang", {}) + render_tool_call("calculator", {"expression": "1+1"})
             + "<tool_call>{not json}</tool_call>" + render_tool_call("nope", {}))
    eng = ScriptedEngine([calls, "done"])
    spec = MultiTurnSpec(tools=("calculator", "t_hang"), max_parallel_calls=3, max_tool_calls=9,
                         tool_timeout_s=3.0, max_total_response_length=2000)  # calculator: ~0.2 s
    t = run(eng, spec)
    assert (t.finish_reason, t.turns, t.tool_calls, t.tool_failures) == ("stop", 2, 3, 3)
    text = eng.tokenizer.decode([x for x, m in zip(t.response_token_ids, t.loss_mask, strict=True) if not m])
    assert "timed out" in text and "\n2\n" in text and "not JSON" in text
    assert "more than 3 tool call(s)" in text


def test_the_slot_is_given_back_while_tools_run():
    events: list[str] = []

    async def pause() -> None:
        events.append("out")

    async def resume() -> None:
        events.append("in")

    run(ScriptedEngine([CALL, CALL, "done"]), pause=pause, resume=resume)
    assert events == ["out", "in", "out", "in"]


def test_parser_and_truncation():
    calls = parse_tool_calls('x <tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call> '
                             '<tool_call>{"name": 3}</tool_call><tool_call>{"name": "g"')
    assert [(c.name, c.arguments, bool(c.error)) for c in calls] == [("f", {"a": 1}, False), ("", None, True),
                                                                    ("", None, True)]
    assert parse_tool_calls("no calls") == []
    assert json.loads(CALL[len("<tool_call>"):-len("</tool_call>")])["name"] == "calculator"
    s = "abcdefghijklmnopqrstuvwxyz" * 4
    assert len(truncate(s, 40, "middle")) == 40 and truncate(s, 40, "left").endswith("z")
    assert truncate(s, 40, "right").startswith("abc") and truncate("short", 40) == "short"


def test_tool_turn_in_the_tiny_models_chat_template():
    from asp_npu.data.init_model import build_tokenizer

    tok = build_tokenizer(400)
    text = tool_turn_text(tok, ["42"])
    assert text == "\n<|tool|>\n42</s>\n<|assistant|>\n"
    # the calc task's SFT target is token for token what a rollout builds when the model makes the call
    from asp_npu.data.tasks import calc_call, make_prompts, tool_transcript

    item = make_prompts("calc", 1, seed=3)[0]
    eng = ScriptedEngine([calc_call(item.text), str(item.ground_truth)], tokenizer=tok)
    t = run(eng, item=item)
    ids, mask = tool_transcript(item, tok)
    assert t.response_token_ids == ids and t.loss_mask == mask and 0 in mask  # the tool turn: no SFT loss
    assert (t.reward, t.tool_calls, t.tool_failures) == (1.0, 1, 0)


def test_config_to_spec_and_metrics(tmp_path):
    cfg = Config()
    assert multi_turn_spec(cfg.multi_turn) is None
    y = tmp_path / "tools.yaml"
    y.write_text("tools:\n  - class_name: x.ReTool\n    tool_schema:\n      function:\n"
                 "        name: code_interpreter\n")
    from dataclasses import replace

    spec = multi_turn_spec(replace(cfg.multi_turn, enable=True, tool_config_path=str(y), max_tool_calls=2))
    assert spec is not None and spec.tools == ("code_interpreter",) and spec.max_tool_calls == 2
    from asp_npu.errors import UserError

    with pytest.raises(UserError, match="tool 'search' is not registered"):
        multi_turn_spec(replace(cfg.multi_turn, enable=True, tools=["search"]))
    t = run(ScriptedEngine([CALL, "x"]))
    m = multi_turn_metrics([t, run(ScriptedEngine(["y"]))])
    assert m["multi_turn/tool_calls_per_traj"] == 0.5 and m["multi_turn/tool_success_rate"] == 1.0
    assert m["multi_turn/turns_mean"] == 1.5
