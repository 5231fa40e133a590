"""The text of tool calling: the model's calls parsed, a call rendered, a tool turn in the chat template.

Format `hermes` (Qwen2.5 / Hermes, what vLLM's `hermes` tool parser and MindSpeed-RL's
`tool_parser_format: hermes` read): a call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
anywhere in the assistant's turn, several per turn allowed. vLLM's own parser class needs the
`<tool_call>` markers as single tokens of the vocabulary (it refuses a tokenizer without them), so the
regular expression below reads the same format on any tokenizer, the tiny CPU models' included.

A tool turn is what the chat template renders for `{"role": "tool"}` messages after an assistant
turn, up to the next assistant turn's header: the text between the end of the assistant's turn (its
end-of-sequence token, which the model sampled) and the next turn. A tokenizer without a chat
template gets `<tool_response>\n...\n</tool_response>\n` per output.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from asp_npu.errors import UserError

FORMATS = ("hermes",)
TRUNCATE_SIDES = ("left", "middle", "right")
_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Any
    error: str = ""  # "" = parsed; else why the call could not be read (the model is told)


def parse_tool_calls(text: str, fmt: str = "hermes") -> list[ToolCall]:
    """The calls in one assistant turn, in order; a malformed call is a ToolCall with `error`."""
    if fmt not in FORMATS:
        raise UserError(f"tool-call format '{fmt}' is not one of {', '.join(FORMATS)}")
    calls = [_one_call(m.group(1)) for m in _CALL_RE.finditer(text)]
    end = text.rfind("</tool_call>")
    tail = text[end + len("</tool_call>"):] if end >= 0 else text
    if "<tool_call>" in tail:  # opened, never closed (cut by the token cap)
        calls.append(ToolCall("", None, "unterminated <tool_call>"))
    return calls


def _one_call(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCall("", None, f"tool call is not JSON ({exc.msg})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall("", None, "tool call needs a string 'name'")
    args = obj.get("arguments", {})
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return ToolCall(obj["name"], None, "tool call 'arguments' is not a JSON object")
    if not isinstance(args, dict):
        return ToolCall(obj["name"], None, "tool call 'arguments' is not a JSON object")
    return ToolCall(obj["name"], args)


def render_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """One call as the model writes it (SFT targets, tests)."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def truncate(text: str, max_chars: int, side: str = "middle") -> str:
    """`text` cut to `max_chars` characters (0 = no cap), keeping the right/left/both ends."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    mark = "...(truncated)..."
    keep = max(0, max_chars - len(mark))
    if side == "left":  # cut on the left: keep the end
        return mark + text[len(text) - keep:]
    if side == "right":
        return text[:keep] + mark
    head = keep // 2
    return text[:head] + mark + text[len(text) - (keep - head):]


def tool_turn_text(tokenizer: Any, outputs: list[str]) -> str:
    """The text that follows an assistant turn (ended by its EOS token) when tools answered `outputs`,
    through to the next assistant turn's header."""
    if not getattr(tokenizer, "chat_template", None):
        return "".join(f"<tool_response>\n{o}\n</tool_response>\n" for o in outputs)
    base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    tools = [{"role": "tool", "content": o} for o in outputs]
    before = tokenizer.apply_chat_template(base, tokenize=False)
    after = tokenizer.apply_chat_template(base + tools, tokenize=False, add_generation_prompt=True)
    eos = str(tokenizer.eos_token or "")
    end = before.rfind("a" + eos) if eos else -1
    cut = end + 1 + len(eos) if end >= 0 else len(before)
    if not after.startswith(before[:cut]):
        raise UserError("the chat template renders a tool turn that changes the turns before it: "
                        "multi-turn rollouts need a template that appends")
    return after[cut:]
