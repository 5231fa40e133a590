"""Prompt templates by name (MindSpeed-RL's `prompt_type`) and a user's own chat template (Jinja).

Why: MindSpeed-RL formats each prompt with a named template before generation, and some of its
verifiers only reward the answer format a template asks for (`qwen_r1` asks for `<think>...</think>
<answer>...</answer>`, which `math_verify_reward` and `base_acc` require). Without the same template
the same config trains on different prompts. verl formats with the tokenizer's chat template, which a
user may replace (`data.chat_template`: a Jinja string, or a file holding one).

A named template renders a single-turn prompt as MindSpeed-RL does: the prefix (the tokenizer's BOS
where the template has one), the system slot (the row's system message, else the template's default
system), then the user slot with the message; later turns are joined by the template's separator
(`llama2` puts the system text inside the first user turn). The text is then tokenised without adding
special tokens. `data.prompt_type` and `data.chat_template` both empty = the tokenizer's own chat
template, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asp_npu.errors import UserError

_R1_INSTRUCTION = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
    "</answer> tags, respectively, i.e., <think> reasoning process here </think><answer> answer here "
    "</answer>. Put your final answer within \\boxed{}."
)
_IM_SYSTEM = "<|im_start|>system\n{content}<|im_end|>\n"
_IM_USER = "<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"


@dataclass(frozen=True)
class Template:
    """One MindSpeed-RL template's slots for a text prompt (`{content}` is the message)."""

    user: str
    system: str = "{content}"
    separator: str = ""
    assistant: str = "{content}"
    bos_prefix: bool = False  # the tokenizer's BOS token first
    default_system: str = ""
    system_in_user: bool = False  # llama2: `<<SYS>>` inside the first user turn


PROMPT_TYPES: dict[str, Template] = {
    "default": Template("Human: {content}\nAssistant:", "{content}\n", "\n"),
    "empty": Template("{content}"),
    "trl": Template("{content}", bos_prefix=True),
    "qwen": Template(_IM_USER, _IM_SYSTEM, "\n", default_system="You are a helpful assistant."),
    "qwen_r1": Template(_IM_USER.replace("{content}", _R1_INSTRUCTION + "\n{content}"), _IM_SYSTEM, "\n",
                        default_system="You are a helpful assistant."),
    "qwen_math_r1": Template(_IM_USER, _IM_SYSTEM, "\n", default_system=(
        "Please reason step by step, and put your final answer within \\boxed{}.")),
    "qwen3": Template(_IM_USER, _IM_SYSTEM, assistant="{content}<|im_end|>\n"),
    "llama3": Template(
        "<|start_header_id|>user<|end_header_id|>\n\n{content}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|start_header_id|>system<|end_header_id|>\n\n{content}<|eot_id|>", bos_prefix=True),
    "mistral": Template("[INST] {content} [/INST]", bos_prefix=True),
    "mixtral": Template("[INST] {content} [/INST]", bos_prefix=True),
    "gemma": Template("<start_of_turn>user\n{content}<end_of_turn>\n<start_of_turn>model\n",
                      separator="<end_of_turn>\n", bos_prefix=True),
    "llama2": Template("{bos}[INST] {content} [/INST]", "<<SYS>>\n{content}\n<</SYS>>\n\n",
                       system_in_user=True),
    "alpaca": Template("### Instruction:\n{content}\n\n### Response:\n", separator="\n\n", default_system=(
        "Below is an instruction that describes a task. Write a response that appropriately completes "
        "the request.\n\n")),
    "deepseek2": Template("User: {content}\n\nAssistant:", "{content}\n\n", bos_prefix=True),
    "deepseek2-lite": Template("User: {content}\n\nAssistant:", "{content}\n\n", bos_prefix=True),
    "minicpm3": Template("User: {content}\n\nAssistant:", "{content}\n\n", bos_prefix=True),
    "baichuan2": Template("<reserved_106>{content}<reserved_107>"),
    "deepseek3": Template("<｜User｜>{content}<｜Assistant｜>", bos_prefix=True),
    "deepseek3_r1": Template(_R1_INSTRUCTION + " <｜User｜>{content}<｜Assistant｜>", bos_prefix=True),
}
# MindSpeed-RL templates for its multi-turn tool-calling rollouts, which asp-npu refuses
TOOL_TEMPLATES = ("qwen_retool", "qwen_search_tool")


def _fill(slot: str, content: str, bos: str) -> str:
    return slot.replace("{bos}", bos).replace("{content}", content)


def render_template(name: str, messages: list[dict[str, str]], bos_token: str = "") -> str:
    """The prompt text of `messages` under MindSpeed-RL template `name` (see the module docstring)."""
    t = PROMPT_TYPES[name]
    system = next((m["content"] for m in messages if m["role"] == "system"), "") or t.default_system
    turns = [m for m in messages if m["role"] != "system"]
    out: list[str] = []
    for i, m in enumerate(turns):
        content = m["content"]
        if i == 0:
            out.append(bos_token if t.bos_prefix else "")
            if system and t.system_in_user:
                content = _fill(t.system, system, bos_token) + content
            elif system:
                out.append(_fill(t.system, system, bos_token))
        elif i % 2 == 0:
            out.append(t.separator)
        out.append(_fill(t.user if m["role"] == "user" else t.assistant, content, bos_token))
    return "".join(out)


def chat_template_source(spec: str) -> str:
    """`data.chat_template` as Jinja source: the string itself, or the file it names."""
    if "{{" in spec or "{%" in spec:
        return spec
    path = Path(spec)
    if not path.is_file():
        raise UserError(f"data.chat_template: '{spec}' is neither a Jinja template nor a file")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"data.chat_template: cannot read {spec} ({type(exc).__name__})") from None


def template_problems(prompt_type: str, chat_template: str) -> list[str]:
    """Problems of `data.prompt_type` / `data.chat_template` (for `config.validate`)."""
    out: list[str] = []
    if prompt_type and chat_template:
        out.append("data.prompt_type and data.chat_template: set one of them, not both")
    if prompt_type in TOOL_TEMPLATES:
        out.append(f"data.prompt_type: '{prompt_type}' is for multi-turn tool calling, which asp-npu does "
                   "not support")
    elif prompt_type and prompt_type not in PROMPT_TYPES:
        out.append(f"data.prompt_type: unknown template '{prompt_type}' (known: {', '.join(PROMPT_TYPES)})")
    if chat_template:
        try:
            import jinja2

            jinja2.Environment().parse(chat_template_source(chat_template))
        except UserError as exc:
            out.append(str(exc))
        except jinja2.TemplateSyntaxError as exc:
            out.append(f"data.chat_template: Jinja syntax error at line {exc.lineno}: {exc.message}")
    return out


def prompt_setting(prompt_type: str, chat_template: str) -> dict[str, str]:
    """What a PromptItem's meta carries so that every `encode_prompt` applies the same template."""
    if prompt_type:
        return {"prompt_type": prompt_type}
    if chat_template:
        return {"chat_template": chat_template_source(chat_template)}
    return {}


def render_prompt(meta: dict[str, Any], messages: list[dict[str, str]], tokenizer: Any) -> str | None:
    """The prompt text under the item's template setting; None = no setting (the tokenizer's template)."""
    if meta.get("prompt_type"):
        return render_template(meta["prompt_type"], messages, getattr(tokenizer, "bos_token", None) or "")
    if meta.get("chat_template"):
        text = tokenizer.apply_chat_template(messages, chat_template=meta["chat_template"], tokenize=False,
                                             add_generation_prompt=True)
        return str(text)
    return None
