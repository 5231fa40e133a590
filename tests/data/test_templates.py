"""Prompt templates: MindSpeed-RL's `prompt_type` names render as its templates do, a custom Jinja chat
template (string or file) replaces the tokenizer's, and every prompt of a config carries its template."""

from __future__ import annotations

from pathlib import Path

import pytest

from asp_npu.data.datasets import config_prompts, encode_prompt
from asp_npu.data.templates import PROMPT_TYPES, render_template, template_problems
from asp_npu.types import PromptItem

Q = [{"role": "user", "content": "What is 6 x 7?"}]


def test_qwen_r1_asks_for_think_and_answer_tags():
    text = render_template("qwen_r1", Q)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    assert "<think> reasoning process here </think><answer> answer here </answer>" in text
    assert text.endswith("Put your final answer within \\boxed{}.\nWhat is 6 x 7?<|im_end|>\n"
                         "<|im_start|>assistant\n")


def test_templates_place_system_prefix_and_turns():
    assert render_template("empty", Q) == "What is 6 x 7?"
    assert render_template("trl", Q, bos_token="<s>") == "<s>What is 6 x 7?"
    sys_q = [{"role": "system", "content": "Be brief."}, *Q]
    assert render_template("qwen", sys_q) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                                              "What is 6 x 7?<|im_end|>\n<|im_start|>assistant\n")
    assert render_template("llama2", sys_q, bos_token="<s>") == (
        "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nWhat is 6 x 7? [/INST]")
    assert render_template("deepseek3_r1", Q, bos_token="<B>").startswith("<B>A conversation between User")
    turns = [*Q, {"role": "assistant", "content": "42"}, {"role": "user", "content": "And 6 x 8?"}]
    assert render_template("default", turns) == ("Human: What is 6 x 7?\nAssistant:42\n"
                                                 "Human: And 6 x 8?\nAssistant:")
    assert {"qwen_r1", "qwen_math_r1", "qwen3", "llama3", "deepseek3", "alpaca"} <= set(PROMPT_TYPES)


def test_encode_prompt_applies_the_items_template(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    item = PromptItem("p", text="Count from 1 to 3.", meta={"prompt_type": "empty"})
    assert encode_prompt(item, tok) == tok.encode("Count from 1 to 3.", add_special_tokens=False)
    jinja = "{% for m in messages %}Q: {{ m['content'] }}{% endfor %} A:"
    item = PromptItem("q", text="Count from 1 to 3.", meta={"chat_template": jinja})
    assert encode_prompt(item, tok) == tok.encode("Q: Count from 1 to 3. A:", add_special_tokens=False)


def test_config_prompts_carry_the_template(tmp_path: Path):
    from asp_npu.config import DataConfig

    items = config_prompts(DataConfig(task="count", num_prompts=3, prompt_type="qwen_r1"))
    assert all(i.meta["prompt_type"] == "qwen_r1" for i in items)
    f = tmp_path / "chat.jinja"
    f.write_text("{{ messages[0]['content'] }}")
    items = config_prompts(DataConfig(task="count", num_prompts=2, chat_template=str(f)))
    assert all(i.meta["chat_template"] == "{{ messages[0]['content'] }}" for i in items)
    assert "prompt_type" not in config_prompts(DataConfig(task="count", num_prompts=1))[0].meta


@pytest.mark.parametrize("prompt_type,chat_template,problem", [
    ("qwen_r2", "", "data.prompt_type: unknown template 'qwen_r2'"),
    ("qwen_retool", "", "multi-turn tool calling"),
    ("qwen", "{{ x }}", "set one of them, not both"),
    ("", "no/such/template.jinja", "neither a Jinja template nor a file"),
    ("", "{% for m in messages %}", "Jinja syntax error"),
])
def test_bad_templates_are_named(prompt_type: str, chat_template: str, problem: str):
    problems = template_problems(prompt_type, chat_template)
    assert len(problems) == 1 and problem in problems[0]
