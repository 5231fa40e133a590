"""The config's `data` section: every row by default, MindSpeed-RL raw keys and verl parquet (incl.
`val_files`) from the config, and the checks `validate` lists before anything starts."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asp_npu.config import Config, validate
from asp_npu.data.datasets import SYNTHETIC_VAL_PROMPTS, config_prompts, config_val_prompts


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_every_row_by_default_and_num_prompts_truncates(tmp_path):
    cfg = Config()
    cfg.data.data_path = _jsonl(tmp_path / "d.jsonl", [{"question": f"q{i}", "answer": str(i)}
                                                      for i in range(1000)])
    assert cfg.data.num_prompts == 0
    assert len(config_prompts(cfg.data)) == 1000  # not 256
    cfg.data.num_prompts = 10
    assert [p.prompt_id for p in config_prompts(cfg.data)][-1] == "d-9"


def test_mindspeed_raw_keys_through_map_keys(tmp_path):
    cfg = Config()
    cfg.data.data_path = _jsonl(tmp_path / "raw.jsonl", [{"Problem": "1+1?", "Hint": "add", "Answer": "2"}])
    cfg.data.map_keys = {"prompt": "Problem", "query": "Hint", "response": "Answer", "system": ""}
    (item,) = config_prompts(cfg.data)
    assert item.text == "1+1?\nadd" and item.ground_truth == "2"
    assert item.meta["messages"] == [{"role": "user", "content": "1+1?\nadd"}]


def test_verl_parquet_train_and_val_files(tmp_path):
    rows = [{"data_source": src, "prompt": [{"role": "user", "content": f"{i}+1?"}],
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}, "extra_info": {"index": i}}
            for i, src in enumerate(["openai/gsm8k", "lighteval/MATH", "openai/gsm8k"])]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:2]), tmp_path / "test.parquet")
    cfg = Config()
    cfg.data.data_path, cfg.data.val_files = str(tmp_path / "train.parquet"), str(tmp_path / "test.parquet")
    cfg.data.layout = "verl"
    assert len(config_prompts(cfg.data)) == 3
    val = config_val_prompts(cfg.data)
    assert [v.prompt_id for v in val] == ["val-test-0", "val-test-1"]
    assert [v.meta["data_source"] for v in val] == ["openai/gsm8k", "lighteval/MATH"]
    assert [v.ground_truth for v in val] == ["1", "2"]


def test_synthetic_validation_is_held_out():
    cfg = Config()
    train = {p.text for p in config_prompts(cfg.data)}
    val = config_val_prompts(cfg.data)
    assert len(val) == SYNTHETIC_VAL_PROMPTS and all(v.prompt_id.startswith("val-") for v in val)
    assert len({v.text for v in val} - train) > len(val) // 2  # another seed: mostly unseen prompts
    assert {v.meta["data_source"] for v in val} == {"asp/count"}


@pytest.mark.parametrize(("changes", "problem"), [
    ({"data.layout": "alpaca"}, "data.layout: 'alpaca'"),
    ({"data.map_keys": {"question": "q"}}, "data.map_keys: unknown role 'question'"),
    ({"data.val_files": "/no/such.parquet"}, "data.val_files: '/no/such.parquet' is not a file"),
    ({"trainer.test_freq": 5, "data.data_path": "d.jsonl"}, "trainer.test_freq: validation needs"),
    ({"rl_config.overlong_buffer_enable": True, "rl_config.overlong_buffer": 256},
     "rl_config.overlong_buffer: must be in (0, max_tokens=256)"),
    ({"rl_config.drop_equal_reward_groups": True, "rl_config.n_samples_per_prompt": 1,
      "rl_config.mini_batch_size": 1}, "rl_config.drop_equal_reward_groups: a group of one sample"),
    ({"trainer.test_freq": -2}, "trainer.test_freq: must be >= -1"),
    ({"generate_config.val_kwargs.n": 0}, "generate_config.val_kwargs.n: must be >= 1"),
])
def test_bad_data_and_dapo_keys_are_listed(changes, problem):
    cfg = Config()
    for dotted, value in changes.items():
        section, key = dotted.rsplit(".", 1)
        obj = cfg
        for part in section.split("."):
            obj = getattr(obj, part)
        setattr(obj, key, value)
    problems = validate(cfg)
    assert any(p.startswith(problem) for p in problems), problems
    assert all("\n" not in p for p in problems)


def test_a_bad_held_out_row_is_refused_before_the_run_starts(tmp_path):
    from asp_npu.errors import UserError
    from asp_npu.pipeline.train import load_run_prompts

    cfg = Config()
    cfg.data.data_path = _jsonl(tmp_path / "train.jsonl", [{"question": "q", "answer": "1"}])
    cfg.data.val_files = _jsonl(tmp_path / "val.jsonl", [{"question": "q", "answer": "1"}, {"question": "q"}])
    cfg.trainer.test_freq = 2
    with pytest.raises(UserError, match=r"val.jsonl:2: no response column"):
        load_run_prompts(cfg)
    cfg.trainer.test_freq = 0  # no validation: the held-out set is not read
    assert len(load_run_prompts(cfg)) == 1
