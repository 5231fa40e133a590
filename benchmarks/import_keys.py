"""What `asp-npu import-config mindspeed-rl|verl` does with every key of MindSpeed-RL's shipped RL configs
(or of verl configs / example override sets written as YAML, with `--source verl`).

    python benchmarks/import_keys.py PATH/TO/MindSpeed-RL/configs [--show-review]
    python benchmarks/import_keys.py tests/fixtures/verl --source verl [--show-review]

One Markdown row per `grpo_*` / `dapo_*` / `ppo_*` file: keys mapped onto asp-npu keys, keys left unmapped
because they have no effect on the trained result (a kernel or dispatch switch, a logger, a
preprocessed-dataset format option, a number asp-npu reads from the model's own config.json, resume
bookkeeping, GAE settings GRPO does not use), and unmapped keys to review: a reason the table does not
classify as without effect. A refused file (a feature asp-npu does not have) is one refusal line.
asp-npu does not ship the configs: fetch them from the MindSpeed-RL repository.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asp_npu.deploy import import_config as ic
from asp_npu.deploy import import_verl as iv
from asp_npu.errors import UserError

# reasons (by their opening words) for keys that do not change what is trained
NO_EFFECT = (
    ic._KERNEL, ic._DATA, ic._HF, ic._SCHED, ic._LOG,
    "the tokenizer is the one saved", "chosen by asp_npu.device", "asp-npu expects model.path",
    "asp-npu always starts from model.path", "resume semantics are asp-npu's own",
    "asp-npu always trains GRPO-style RL", "GAE discount", "GAE lambda", "no effect on the trained result",
    "asp-npu loads Qwen2/Llama-family", "empty (null) in the file",
    "asp-npu sizes training sequences", "asp-npu checkpoints always hold", "asp-npu seeds sampling from",
    "loss scaling is for fp16", "vllm-ascend torchair graph mode", "vLLM V1 has no multi-step",
    "asp-npu always enables vLLM prefix caching", "asp-npu always clips with clip_ratio_low",
    # verl's (asp_npu.deploy.import_verl)
    *set(iv.NO_EFFECT.values()), "no effect: that KL term is off", "no effect: a Hydra target class",
)
# transport, placement and memory switches whose reason is the generic fallback
NO_EFFECT_KEYS = ("zmq_communication", "hccl_buffersize", "ascend_scheduler_config_enabled",
                  "expert_map_path",
                  "reuse_fp32_param")


def classify(key: str, reason: str) -> str:
    quiet = any(r in reason for r in NO_EFFECT) or key.split(".")[-1] in NO_EFFECT_KEYS
    return "no effect" if quiet else "review"


def ledger(path: Path, source: str = "mindspeed-rl") -> tuple[str, int, list[str], list[str]]:
    """(refusal or '', mapped count, unmapped without effect, unmapped to review) of one file."""
    from omegaconf import OmegaConf

    ms = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    translate = iv.translate_verl if source == "verl" else ic.translate
    try:
        tr = translate(ms, path, mode="mindspeed-sync")  # no layout search: the keys are the same
    except UserError as exc:
        return str(exc), 0, [], []
    quiet = [k for k, why in tr.unmapped if classify(k, why) == "no effect"]
    review = [f"{k}: {why}" for k, why in tr.unmapped if classify(k, why) == "review"]
    return "", len(tr.mapped), quiet, review


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--show-review", action="store_true", help="list each key to review under the table")
    ap.add_argument("--source", choices=["mindspeed-rl", "verl"], default="mindspeed-rl")
    args = ap.parse_args()
    files = sorted(p for p in args.folder.glob("*.yaml")
                   if args.source == "verl" or p.name.split("_")[0] in ("grpo", "dapo", "ppo"))
    print("| config | mapped | unmapped, no effect | unmapped, to review | refused |")
    print("|---|---|---|---|---|")
    reviews: list[str] = []
    for f in files:
        refused, mapped, quiet, review = ledger(f, args.source)
        if refused:
            print(f"| {f.name} | - | - | - | {refused} |")
            continue
        print(f"| {f.name} | {mapped} | {len(quiet)} | {len(review)} | - |")
        reviews += [f"{f.name}: {r}" for r in review]
    if args.show_review:
        print("\nto review:")
        print("\n".join(f"- {r}" for r in reviews) or "- none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
