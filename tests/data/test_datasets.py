"""Prompt datasets in the verl and MindSpeed-RL layouts; every bad row names its file and row."""

from __future__ import annotations

import json

import pytest

from asp_npu.data.datasets import encode_prompt, load_dataset, load_prompts
from asp_npu.errors import UserError
from asp_npu.types import PromptItem

VERL_ROWS = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "What is 2+3?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "5"},
        "extra_info": {"split": "train", "index": 0},
    },
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "7*6?"}],
        "reward_model": {"style": "rule", "ground_truth": "42"},
    },
]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_verl_jsonl(tmp_path):
    items = load_dataset(write_jsonl(tmp_path / "gsm.jsonl", VERL_ROWS))
    assert [i.prompt_id for i in items] == ["gsm-0", "gsm-1"]
    assert items[0].text == "What is 2+3?" and items[0].ground_truth == "5"
    assert items[0].meta["data_source"] == "openai/gsm8k"
    assert items[1].meta["messages"][0] == {"role": "system", "content": "Be brief."}


def test_verl_parquet_and_string_prompt(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{**VERL_ROWS[0], "prompt": "Plain string prompt"}, {**VERL_ROWS[0]}]
    rows[1]["prompt"] = "Second"
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    items = load_dataset(tmp_path / "train.parquet", layout="verl")
    assert [i.text for i in items] == ["Plain string prompt", "Second"]
    assert items[0].meta["messages"] == [{"role": "user", "content": "Plain string prompt"}]

    bad = [rows[0], {"data_source": "x", "prompt": "q", "reward_model": {"style": "rule"}}]
    pq.write_table(pa.Table.from_pylist(bad), tmp_path / "bad.parquet")
    with pytest.raises(UserError, match=r"bad.parquet: row 1: missing 'reward_model.ground_truth'"):
        load_dataset(tmp_path / "bad.parquet")


def test_mindspeed_layout_and_map_keys(tmp_path):
    rows = [
        {"problem": "Compute 1+1.", "answer": "2"},
        {"problem": "Compute 2+2.", "answer": "4", "input": "fast"},
    ]
    items = load_dataset(write_jsonl(tmp_path / "deepscaler.jsonl", rows))
    assert items[0].text == "Compute 1+1." and items[0].ground_truth == "2"
    assert items[1].text == "Compute 2+2.\nfast"
    arr = tmp_path / "alpaca.json"
    arr.write_text(json.dumps([{"q": "Say hi", "a": "hi", "sys": "You are nice."}]))
    items = load_dataset(arr, layout="mindspeed", map_keys={"prompt": "q", "response": "a", "system": "sys"})
    assert items[0].meta["messages"] == [
        {"role": "system", "content": "You are nice."},
        {"role": "user", "content": "Say hi"},
    ]


def test_bad_rows_name_file_and_row(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"problem": "a", "answer": "1"}) + "\n\n{not json\n")
    with pytest.raises(UserError, match=r"d.jsonl:3: malformed JSON"):
        load_dataset(p)
    write_jsonl(p, [{"problem": "a", "answer": "1"}, {"problem": "b", "answer": "2"}])
    with pytest.raises(
        UserError, match=r"d.jsonl:1: no column 'question' \(map_keys.prompt; columns: answer, problem\)"
    ):
        load_dataset(p, map_keys={"prompt": "question"})
    write_jsonl(p, [{"problem": "a", "answer": "1"}, {"text": "b"}])
    with pytest.raises(UserError, match=r"d.jsonl:2: no prompt column"):
        load_dataset(p)
    write_jsonl(p, [{"problem": "a", "answer": " "}])
    with pytest.raises(UserError, match=r"d.jsonl:1: empty ground truth"):
        load_dataset(p)
    write_jsonl(p, [{**VERL_ROWS[0], "prompt": [{"role": "user"}]}])
    with pytest.raises(UserError, match=r"d.jsonl:1: column 'prompt' must be"):
        load_dataset(p)
    write_jsonl(p, [VERL_ROWS[0]])
    with pytest.raises(UserError, match=r"d.jsonl:1: no column 'question'"):
        load_dataset(p, prompt_key="question")
    with pytest.raises(UserError, match="no such dataset file"):
        load_dataset(tmp_path / "missing.jsonl")
    with pytest.raises(UserError, match="layout"):
        load_dataset(p, layout="hf")
    with pytest.raises(UserError, match="unknown role"):
        load_dataset(p, map_keys={"answer": "x"})
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UserError, match="no rows"):
        load_dataset(tmp_path / "empty.jsonl")


def test_load_prompts_from_file_or_task(tmp_path):
    assert len(load_prompts("", "count", 7, seed=1)) == 7
    path = write_jsonl(tmp_path / "g.jsonl", VERL_ROWS)
    assert [i.prompt_id for i in load_prompts(path, "count", 1, seed=1)] == ["g-0"]


def test_encode_prompt_uses_the_chat_template(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    ids = encode_prompt(PromptItem("p", text="Count from 1 to 3."), tok)
    assert tok.decode(ids) == "<|user|>\nCount from 1 to 3.</s>\n<|assistant|>\n"
    assert encode_prompt(PromptItem("q", prompt_token_ids=[7, 8]), tok) == [7, 8]
    raw = encode_prompt(PromptItem("r", text="Count", meta={"raw_prompt": True}), tok)
    assert tok.decode(raw) == "Count"
