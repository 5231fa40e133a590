"""Prompt datasets from files users already have: verl and MindSpeed-RL layouts, JSONL/JSON/Parquet.

verl layout (one row per prompt): `prompt` = chat messages `[{"role", "content"}, ...]` (a plain
string is taken as the user message), `reward_model.ground_truth`, `data_source`, optional
`extra_info`. MindSpeed-RL layout (its raw alpaca-style rows before Megatron preprocessing): the
prompt in `problem` / `question` / `prompt` / `instruction` (+ optional `input` and `system`), the
answer in `answer` / `solution` / `response` / `output`; `map_keys` picks other columns, as
MindSpeed-RL's `map_keys` does. Every defect raises one UserError naming file and row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asp_npu.errors import UserError
from asp_npu.io import check_readable, loads_strict, read_text_file
from asp_npu.types import PromptItem
from asp_npu.validation import check_int

LAYOUTS = ("auto", "verl", "mindspeed")
SYNTHETIC_PROMPTS = 256  # the synthetic task's size when data.num_prompts is 0
SYNTHETIC_VAL_PROMPTS = 32  # held-out synthetic prompts for validation when data.val_num_prompts is 0
VAL_SEED_OFFSET = 7919  # held-out synthetic prompts come from another seed than the training ones
MINDSPEED_CANDIDATES = {
    "prompt": ("problem", "question", "prompt", "instruction"),
    "response": ("answer", "solution", "response", "output"),
    "query": ("input",),
    "system": ("system",),
}


def _iter_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, row) pairs; `where` is `file:line` for JSONL, `file: row i` (0-based) otherwise."""
    if not path.exists():
        raise UserError(f"{path}: no such dataset file")
    check_readable(path, ".jsonl/.json/.parquet file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises several types for corrupt files
            raise UserError(f"{path}: cannot read Parquet ({str(exc).splitlines()[0]})") from None
        return [(f"{path}: row {i}", r) for i, r in enumerate(rows)]
    text = read_text_file(path, "dataset file")
    if suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = loads_strict(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: malformed JSON ({exc.msg} at line {exc.lineno})") from None
        except ValueError as exc:
            raise UserError(f"{path}: malformed JSON ({exc})") from None
        return [(f"{path}: row {i}", r) for i, r in enumerate(rows)]
    out = []
    lines = text.splitlines()
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append((f"{path}:{line_no}", loads_strict(line)))
        except json.JSONDecodeError as exc:
            torn = " (torn last line?)" if line_no == len(lines) and not text.endswith("\n") else ""
            raise UserError(
                f"{path}:{line_no}: malformed JSON ({exc.msg}; column {exc.colno}){torn}"
            ) from None
        except ValueError as exc:
            raise UserError(f"{path}:{line_no}: malformed JSON ({exc})") from None
    return out


def _messages(where: str, value: Any, column: str) -> list[dict[str, str]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if (
        isinstance(value, list)
        and value
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value
        )
    ):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise UserError(f"{where}: column '{column}' must be a string or a list of {{role, content}} messages")


def _verl_row(where: str, row: dict[str, Any], prompt_key: str) -> tuple[list[dict[str, str]], Any, str]:
    if prompt_key not in row:
        raise UserError(f"{where}: no column '{prompt_key}' (columns: {', '.join(sorted(row))})")
    messages = _messages(where, row[prompt_key], prompt_key)
    rm = row.get("reward_model")
    if not isinstance(rm, dict) or rm.get("ground_truth") is None:
        raise UserError(f"{where}: missing 'reward_model.ground_truth'")
    return messages, rm["ground_truth"], str(row.get("data_source") or "")


def _pick(row: dict[str, Any], role: str, map_keys: dict[str, str]) -> str | None:
    if role in map_keys:
        return map_keys[role] or None
    return next((k for k in MINDSPEED_CANDIDATES[role] if k in row), None)


def _mindspeed_row(
    where: str, row: dict[str, Any], map_keys: dict[str, str]
) -> tuple[list[dict[str, str]], Any, str]:
    cols = {role: _pick(row, role, map_keys) for role in MINDSPEED_CANDIDATES}
    for role in ("prompt", "response"):
        if cols[role] is None:
            raise UserError(
                f"{where}: no {role} column (tried {', '.join(MINDSPEED_CANDIDATES[role])}; "
                f"columns: {', '.join(sorted(row))}; set map_keys)"
            )
    for role, col in cols.items():
        if col is not None and col not in row and role in ("prompt", "response"):
            raise UserError(
                f"{where}: no column '{col}' (map_keys.{role}; columns: {', '.join(sorted(row))})"
            )
    prompt = row[cols["prompt"]]  # type: ignore[index]
    if not isinstance(prompt, str):
        raise UserError(f"{where}: column '{cols['prompt']}' must be a string")
    query = row.get(cols["query"]) if cols["query"] else None
    content = prompt if not query else f"{prompt}\n{query}"
    messages = [{"role": "user", "content": content}]
    system = row.get(cols["system"]) if cols["system"] else None
    if isinstance(system, str) and system:
        messages.insert(0, {"role": "system", "content": system})
    return messages, row[cols["response"]], str(row.get("data_source") or "")  # type: ignore[index]


def load_dataset(
    path: str | Path,
    layout: str = "auto",
    map_keys: dict[str, str] | None = None,
    prompt_key: str = "prompt",
    limit: int | None = None,
) -> list[PromptItem]:
    """Read every row into a PromptItem (`prompt_id` = `<file stem>-<row index>`, stable across epochs)."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise UserError(f"dataset layout '{layout}' is not one of {', '.join(LAYOUTS)}")
    if map_keys is not None and (
        not isinstance(map_keys, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in map_keys.items())
    ):
        raise UserError(f"map_keys must map roles to column names (strings), got {map_keys!r}")
    if not isinstance(prompt_key, str) or not prompt_key:
        raise UserError(f"prompt_key must be a column name (got {prompt_key!r})")
    if limit is not None:
        check_int("number of prompts", limit, 1, 100_000_000)
    unknown = set(map_keys or {}) - set(MINDSPEED_CANDIDATES)
    if unknown:
        raise UserError(
            f"map_keys: unknown role(s) {', '.join(sorted(unknown))} "
            f"(known: {', '.join(MINDSPEED_CANDIDATES)})"
        )
    p = Path(path)
    items: list[PromptItem] = []
    for idx, (where, row) in enumerate(_iter_rows(p)):
        if limit is not None and idx >= limit:
            break
        if not isinstance(row, dict):
            raise UserError(f"{where}: expected an object, got {type(row).__name__}")
        kind = layout
        if kind == "auto":
            kind = "verl" if "reward_model" in row else "mindspeed"
        if kind == "verl":
            messages, truth, source = _verl_row(where, row, prompt_key)
        else:
            messages, truth, source = _mindspeed_row(where, row, dict(map_keys or {}))
        if truth is None or (isinstance(truth, str) and not truth.strip()):
            raise UserError(f"{where}: empty ground truth")
        items.append(
            PromptItem(
                prompt_id=f"{p.stem}-{idx}",
                text=messages[-1]["content"],
                ground_truth=truth,
                meta={"data_source": source, "messages": messages, "source_file": str(p), "row": idx},
            )
        )
    if not items:
        raise UserError(f"{p}: no rows")
    return items


def load_prompts(
    data_path: str, task: str, num_prompts: int, seed: int, length_dist: str = "", **kwargs: Any
) -> list[PromptItem]:
    """The config's `data` section: a dataset file if given (every row; `num_prompts` > 0 truncates),
    else the synthetic task (`num_prompts` prompts, SYNTHETIC_PROMPTS when 0).

    `length_dist` (synthetic tasks only) is a `parse_length_dist` spec for the answer lengths, e.g.
    `lognormal:median=6,sigma=1.4,max=160`; empty = the task's default distribution.
    """
    if data_path:
        return load_dataset(data_path, limit=num_prompts or None, **kwargs)
    from asp_npu.data.tasks import make_prompts, parse_length_dist

    return make_prompts(task, num_prompts or SYNTHETIC_PROMPTS, seed,
                        parse_length_dist(length_dist) if length_dist else None)


def _file_keys(data: Any) -> dict[str, Any]:
    return {"layout": data.layout, "map_keys": dict(data.map_keys) or None, "prompt_key": data.prompt_key}


def config_prompts(data: Any) -> list[PromptItem]:
    """The prompts a config's `data` section (`asp_npu.config.DataConfig`) names, each carrying the
    section's prompt template (`prompt_type` / `chat_template`) for `encode_prompt`."""
    from asp_npu.data.templates import prompt_setting

    items = load_prompts(data.data_path, data.task, data.num_prompts, data.seed, data.length_dist,
                         **(_file_keys(data) if data.data_path else {}))
    setting = prompt_setting(data.prompt_type, data.chat_template)
    for item in items if setting else []:
        item.meta.update(setting)
    return items


def config_val_prompts(data: Any) -> list[PromptItem]:
    """The held-out set validation scores: `data.val_files` (verl), else synthetic prompts of the task
    drawn with another seed. Ids are prefixed `val-` so they never collide with training groups."""
    from asp_npu.data.templates import prompt_setting

    if data.val_files:
        items = load_dataset(data.val_files, limit=data.val_num_prompts or None, **_file_keys(data))
    else:
        from asp_npu.data.tasks import make_prompts, parse_length_dist

        dist = parse_length_dist(data.length_dist) if data.length_dist else None
        items = make_prompts(data.task, data.val_num_prompts or SYNTHETIC_VAL_PROMPTS,
                             data.seed + VAL_SEED_OFFSET, dist)
    setting = prompt_setting(data.prompt_type, data.chat_template)
    for it in items:
        it.meta.update(setting)
        it.prompt_id = f"val-{it.prompt_id}"
        it.meta.setdefault("data_source", "")
        if not it.meta["data_source"]:
            it.meta["data_source"] = data.task if not data.val_files else Path(data.val_files).stem
    return items


def encode_prompt(item: PromptItem, tokenizer: Any) -> list[int]:
    """Token ids the engine sees: given ids, else the item's prompt template (`asp_npu.data.templates`)
    or the tokenizer's chat template over the messages, else the text."""
    from asp_npu.data.templates import render_prompt

    if item.prompt_token_ids:
        return list(item.prompt_token_ids)
    messages = item.meta.get("messages") or [{"role": "user", "content": item.text or ""}]
    templated = render_prompt(item.meta, messages, tokenizer)
    if templated is not None:
        return list(tokenizer.encode(templated, add_special_tokens=False))
    if getattr(tokenizer, "chat_template", None) and not item.meta.get("raw_prompt"):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode("\n".join(m["content"] for m in messages)))
