"""The calc task's whole multi-turn answer, greedy, with and without the calculator (issue 29).

Usage: PYTHONPATH=. .venv/bin/python benchmarks/calc_eval.py MODEL_DIR
       [--config configs/cpu_calc_multi_turn.yaml] [--prompts 64] [key=value ...]

On the config's RL prompts (its `data` section: task, seed, length distribution, as `asp-npu train`
draws them), greedy HF decoding of what a rollout builds: the model's first turn; its calls run through
the real sandboxed calculator (`rollout.tools.call_tool`); the tool turn in the chat template; the
model's answer. Scored by the run's reward function (share of the answer's digits right in position,
1.0 exact). `withheld`: the same, but every tool turn reads an error instead of the product -- what the
model answers without the calculator (the floor a policy that cannot use the tool is held to).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WITHHELD = "error: the calculator is unavailable"


def _greedy(model, tok, contexts: list[list[int]], cap: int) -> list[list[int]]:
    import torch

    out_rows = []
    for i in range(0, len(contexts), 16):
        chunk = contexts[i : i + 16]
        width = max(len(x) for x in chunk)
        inp = torch.tensor([[tok.pad_token_id] * (width - len(x)) + x for x in chunk])
        att = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in chunk])
        with torch.no_grad():
            out = model.generate(input_ids=inp, attention_mask=att, max_new_tokens=cap, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        for row in out[:, width:].tolist():
            out_rows.append(row[: row.index(tok.eos_token_id)] if tok.eos_token_id in row else row)
    return out_rows


async def _tool_texts(calls_per_prompt: list[list], withhold: bool, timeout_s: float) -> list[list[str]]:
    from asp_npu.rollout.tools import call_tool

    async def one(c) -> str:
        if c.error:
            return f"error: {c.error}"
        if withhold:
            return WITHHELD
        return (await call_tool(c.name, c.arguments, timeout_s)).text

    return [list(await asyncio.gather(*(one(c) for c in calls))) for calls in calls_per_prompt]


def evaluate(model_dir: str, prompts: list, withhold: bool, cap: int = 192) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asp_npu.data.datasets import encode_prompt
    from asp_npu.data.rewards import compute_reward
    from asp_npu.data.tasks import calc_call
    from asp_npu.data.tool_format import parse_tool_calls, tool_turn_text

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ctx = [encode_prompt(p, tok) for p in prompts]
    first = _greedy(model, tok, ctx, cap)
    texts = [tok.decode(r, skip_special_tokens=True) for r in first]
    calls = [parse_tool_calls(t) for t in texts]
    outs = asyncio.run(_tool_texts(calls, withhold, 10.0))
    enc = lambda text: list(tok.encode(text, add_special_tokens=False))  # noqa: E731
    second_ctx = [c + r + [tok.eos_token_id] + enc(tool_turn_text(tok, o))
                  for c, r, o in zip(ctx, first, outs, strict=True)]
    with_call = [i for i, c in enumerate(calls) if c]
    answers = dict(zip(with_call, _greedy(model, tok, [second_ctx[i] for i in with_call], cap), strict=True))
    rewards, exact = [], []
    for i, p in enumerate(prompts):
        text = texts[i] + ("\n" + tok.decode(answers[i], skip_special_tokens=True) if i in answers else "")
        src = str(p.meta.get("data_source", "asp/calc"))
        rewards.append(compute_reward(src, text, p.ground_truth, partial=True))
        exact.append(compute_reward(src, text, p.ground_truth, partial=False))
    n = len(prompts)
    ok_calls = sum(1 for o in outs for x in o if not x.startswith("error"))
    all_calls = sum(len(o) for o in outs)
    right = sum(t.strip() == calc_call(p.text or "") for t, p in zip(texts, prompts, strict=True))
    return {"call_exact": right / n,
            "calls_per_prompt": all_calls / n, "tool_success": ok_calls / max(1, all_calls),
            "reward": sum(rewards) / n, "exact": sum(exact) / n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--config", default="configs/cpu_calc_multi_turn.yaml")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("overrides", nargs="*", help="key=value config overrides (data.length_dist=...)")
    args = ap.parse_args()
    from asp_npu.config import load_config
    from asp_npu.data.datasets import config_prompts

    cfg = load_config(args.config, args.overrides)
    prompts = config_prompts(cfg.data)[: args.prompts]
    for withhold in (False, True):
        r = evaluate(args.model, prompts, withhold)
        label = "withheld" if withhold else "calculator"
        line = " ".join(f"{k}={v:.3f}" for k, v in r.items())
        print(f"{label:10s} prompts={len(prompts)} {line}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
