"""`asp-npu sft`: supervised warm-start of the policy on a synthetic task, so RL starts with reward.

A randomly initialised model never produces an exact answer, so GRPO would see all-zero groups and
learn nothing. SFT trains the same megatron-core trainer (same TP/PP/DP layout, Ray actor group) on
task examples with the answer as the response, then writes an HF folder (config + tokenizer + new
weights) that vLLM and `asp-npu train` load. Progress is the greedy exact-match reward on the RL
prompts (`data` section), measured with the HF model loaded from the written weights.
"""

from __future__ import annotations

import math
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from asp_npu.config import Config
from asp_npu.trainer.start import RankStart
from asp_npu.types import PromptItem, TrainBatch, Trajectory

Example = tuple[list[int], list[int], list[int]]  # prompt ids, response ids, loss mask ([] = every token)


def training_examples(cfg: Config, tokenizer: Any) -> list[Example]:
    """(prompt ids, answer ids + eos, loss mask) from the task generator, answers capped at
    sft.max_items; a tool task's answer is its whole multi-turn transcript (call, tool turn, answer: the
    call format), its tool turn masked out of the loss as in RL."""
    from asp_npu.data.datasets import encode_prompt
    from asp_npu.data.tasks import (
        DEFAULT_MAX_ITEMS,
        TOOL_TASKS,
        LengthDist,
        make_prompts,
        tool_transcript,
    )

    s = cfg.sft
    task = cfg.data.task
    cap = min(s.max_items, DEFAULT_MAX_ITEMS.get(task, s.max_items))
    items = make_prompts(task, s.num_examples, seed=s.seed, dist=LengthDist(max_items=max(1, cap)))
    eos = tokenizer.eos_token_id
    if task in TOOL_TASKS:
        return [(encode_prompt(it, tokenizer), *tool_transcript(it, tokenizer)) for it in items]
    return [
        (
            encode_prompt(it, tokenizer),
            list(tokenizer.encode(str(it.ground_truth), add_special_tokens=False)) + [eos],
            [],
        )
        for it in items
    ]


def to_batch(examples: list[Example]) -> TrainBatch:
    trajs = [
        Trajectory(f"sft-{i}", 0, p, r, [0.0] * len(r), "stop", 0.0, 0, loss_mask=list(m))
        for i, (p, r, m) in enumerate(examples)
    ]
    return TrainBatch(trajs, group_size=1)


def evaluate(
    model_dir: str | Path, prompts: list[PromptItem], max_new_tokens: int, batch_size: int = 16
) -> dict[str, float]:
    """Greedy decoding with the HF model of `model_dir`: exact-match rate and the RL (partial) reward.

    Prompts are batched by answer length and each batch decodes at most 2 x its longest answer + 8
    tokens (never more than `max_new_tokens`): greedy tokens do not depend on the cap, so exact match
    is unaffected, while an untrained model no longer babbles to max_tokens on every prompt.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asp_npu.data.datasets import encode_prompt
    from asp_npu.data.rewards import compute_reward
    from asp_npu.data.tasks import calc_call

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()

    def target(p: Any) -> str:  # a calc prompt's first turn is its tool call (~70 tokens), not the answer
        calc = str(p.meta.get("data_source", "")) == "asp/calc"
        return calc_call(p.text or "") if calc else str(p.ground_truth)

    answer_len = {p.prompt_id: len(tok.encode(target(p), add_special_tokens=False)) for p in prompts}
    ordered = sorted(prompts, key=lambda p: answer_len[p.prompt_id])
    exact, partial, lengths = [], [], []
    for i in range(0, len(ordered), batch_size):
        chunk = ordered[i : i + batch_size]
        ids = [encode_prompt(p, tok) for p in chunk]
        width = max(len(x) for x in ids)
        cap = min(max_new_tokens, 2 * max(answer_len[p.prompt_id] for p in chunk) + 8)
        inp = torch.tensor([[tok.pad_token_id] * (width - len(x)) + x for x in ids])
        att = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        with torch.no_grad():
            out = model.generate(
                input_ids=inp,
                attention_mask=att,
                max_new_tokens=cap,
                do_sample=False,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )
        for p, row in zip(chunk, out[:, width:].tolist(), strict=True):
            if tok.eos_token_id in row:
                row = row[: row.index(tok.eos_token_id)]
            text = tok.decode(row, skip_special_tokens=True)
            source = str(p.meta.get("data_source", ""))
            if source == "asp/calc":  # greedy decoding stops at the call's EOS: is it the right call?
                exact.append(float(text.strip() == calc_call(p.text or "")))
                partial.append(exact[-1])
                lengths.append(len(row))
                continue
            exact.append(compute_reward(source, text, p.ground_truth, partial=False))
            partial.append(compute_reward(source, text, p.ground_truth, partial=True))
            lengths.append(len(row))
    n = max(1, len(exact))
    return {"exact_match": sum(exact) / n, "reward": sum(partial) / n, "response_len": sum(lengths) / n}


def lr_at(step: int, steps: int, peak: float) -> float:
    """Linear warm-up over the first 5% of steps, then cosine decay to 10% of the peak."""
    warm = max(1, steps // 20)
    if step <= warm:
        return peak * step / warm
    frac = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))


def warm_start(
    cfg: Config, out_dir: str | None = None, steps: int | None = None, log: Any = None,
    start: RankStart | None = None,
) -> dict[str, Any]:
    """SFT for `steps` (default sft.steps) and write the HF folder `out_dir` (default sft.out), starting
    from `start`'s policy (None: `model.path`, or `model.load_megatron`'s weights).

    Returns {"steps", "seconds", "final_loss", "losses", "evals": [{"step", "exact_match", "reward", ...}],
    "out"}; "seconds" is the training time (evaluations excluded).
    """
    from transformers import AutoTokenizer

    from asp_npu.data.datasets import config_prompts
    from asp_npu.trainer.group import TrainerGroup
    from asp_npu.trainer.hf_export import save_hf_folder

    s = cfg.sft
    steps = s.steps if steps is None else steps
    out = Path(out_dir or s.out)
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    start = start or RankStart.of(cfg)
    src = start.policy_path
    tok = AutoTokenizer.from_pretrained(src)
    examples = training_examples(cfg, tok)
    eval_set = config_prompts(cfg.data)[: s.eval_prompts]
    max_new = cfg.generate_config.sampling_config.max_tokens
    evals = [{"step": 0, **evaluate(src, eval_set, max_new)}]
    log(f"sft: step 0 exact_match={evals[0]['exact_match']:.3f} reward={evals[0]['reward']:.3f}")
    t0 = time.time()
    group = TrainerGroup(cfg, start=start)
    made = [p for p in (out.parent, *out.parent.parents) if not p.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    eval_dir = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".eval", dir=out.parent))
    try:  # the model evaluated mid-run gets a unique name, removed at the end
        metrics, losses = _train(cfg, group, src, examples, steps, eval_dir / "model", eval_set, evals, log)
        save_hf_folder(group.get_hf_weights(), src, out, cfg.model.dtype)
    finally:
        group.shutdown()
        shutil.rmtree(eval_dir, ignore_errors=True)
        if not out.exists():  # failed or interrupted: no empty folder made for it is left
            _remove_empty(made)
    seconds = time.time() - t0
    evals.append({"step": steps, **evaluate(out, eval_set, max_new)})
    log(
        f"sft: step {steps} exact_match={evals[-1]['exact_match']:.3f} reward={evals[-1]['reward']:.3f} "
        f"-> {out}"
    )
    return {
        "steps": steps,
        "seconds": seconds,
        "final_loss": metrics.get("loss"),
        "losses": losses,
        "evals": evals,
        "out": str(out),
    }


def _remove_empty(folders: list[Path]) -> None:
    """The folders made for the output (deepest first), those still empty removed."""
    for f in folders:
        try:
            f.rmdir()
        except OSError:
            return


def _train(cfg: Config, group: Any, src: str, examples: list[Example], steps: int, tmp_eval: Path,
           eval_set: list[Any], evals: list[dict[str, Any]], log: Any
           ) -> tuple[dict[str, float], list[float]]:
    """The SFT steps over shuffled passes of `examples`, evaluated every `sft.eval_every` steps (appended
    to `evals`); returns the last step's metrics and every step's loss."""
    from asp_npu.trainer.hf_export import save_hf_folder

    s = cfg.sft
    max_new = cfg.generate_config.sampling_config.max_tokens
    rng = random.Random(s.seed)
    t0 = time.time()
    metrics: dict[str, float] = {}
    losses: list[float] = []
    order: list[int] = []
    for step in range(1, steps + 1):
        if len(order) < s.batch_size:
            order += rng.sample(range(len(examples)), len(examples))
        picked, order = order[: s.batch_size], order[s.batch_size :]
        metrics = group.sft_step(to_batch([examples[i] for i in picked]), lr_at(step, steps, s.lr))
        losses.append(metrics["loss"])
        if step % 10 == 0 or step == steps:
            log(f"sft: step {step}/{steps} loss={metrics['loss']:.4f} "
                f"tokens/s={metrics['tokens_per_s']:.0f} elapsed={time.time() - t0:.0f}s")
        if s.eval_every and step % s.eval_every == 0 and step != steps:
            save_hf_folder(group.get_hf_weights(), src, tmp_eval, cfg.model.dtype)
            evals.append({"step": step, **evaluate(tmp_eval, eval_set, max_new)})
            e = evals[-1]
            log(f"sft: step {step} exact_match={e['exact_match']:.3f} reward={e['reward']:.3f}")
    return metrics, losses


def prepare_model(cfg: Config) -> None:
    """Build the tiny local model when model.path is absent and model.build_if_missing allows it."""
    from asp_npu.data.init_model import build_model_dir, check_model_dir

    if not Path(cfg.model.path).exists() and cfg.model.build_if_missing:
        build_model_dir(cfg.model.path, cfg.model.size, seed=cfg.data.seed, arch=cfg.model.architecture)
    check_model_dir(cfg.model.path)
