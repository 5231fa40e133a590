"""Checkpoints in and out (issue 24 item 3), measured: deterministic parity figures, no timings.

Usage: .venv/bin/python benchmarks/ckpt_io.py [--json]

1. A TP=2 x PP=2 megatron-core model (4 gloo ranks, the tests' random Qwen2: 4 layers... as
   `tests/trainer/helpers.make_hf_model` builds it, weights then moved off it per shard) writes Megatron-LM's
   legacy layout (each rank's `state_dict_for_save_checkpoint()` torch.save'd as
   iter_0000007/mp_rank_TT_PPP/model_optim_rng.pt + latest_checkpointed_iteration.txt: megatron-core
   has no legacy writer, this is what Megatron-LM's save_checkpoint writes) and a megatron-core dist
   checkpoint (`dist_checkpointing.save`); trainers at TP=1 (and TP=2) start from each through
   `actor_config.load` (read as `model.load_megatron`): max |logit difference| vs the source model.
2. Two GRPO steps at TP=2 on the init-model tiny Qwen2, the trainer's own checkpoint, `asp-npu export-hf`:
   the folder's files, max |logit difference| transformers vs trainer, and vLLM greedy tokens vs
   transformers greedy tokens on the exported folder.
3. Bad input through the CLI: exit code, one line, nothing written.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [[5, 17, 42, 99, 3], [7, 7, 120, 64], [300, 12, 1, 250, 77, 31]]
NEW_TOKENS = 16


def _hf_greedy(out: Path) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    result = []
    for p in PROMPTS:
        ids = torch.tensor([p])
        with torch.no_grad():
            for _ in range(NEW_TOKENS):
                nxt = hf(ids).logits[0, -1].argmax()
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
        result.append(ids[0, len(p):].tolist())
    return result


def _vllm_greedy(out: Path) -> list[list[int]]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(out), dtype="float32", enforce_eager=True, max_model_len=256, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def vllm_vs_transformers_greedy(out: Path) -> dict[str, Any]:
    """Greedy tokens of vLLM (a child process: it owns its engine) and of transformers on `out`."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1",
           "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run([sys.executable, __file__, "--vllm-greedy", str(out)], env=env, text=True,
                          capture_output=True, timeout=600)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    vllm_tokens = json.loads(proc.stdout.strip().splitlines()[-1])
    hf_tokens = _hf_greedy(out)
    pairs = [(a, b) for x, y in zip(vllm_tokens, hf_tokens, strict=True) for a, b in zip(x, y, strict=True)]
    return {"tokens": len(pairs), "equal_tokens": sum(a == b for a, b in pairs), "vllm": vllm_tokens,
            "transformers": hf_tokens}


def _max_diff(a: Any, b: Any) -> float:
    import numpy as np

    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def initial_policy(root: Path) -> dict[str, Any]:
    from tests.trainer import ckpt_jobs
    from tests.trainer.helpers import make_hf_model, run_ranks

    model = make_hf_model(root / "hf", tied=False)
    legacy, dist_root = root / "legacy", root / "dist"
    out = run_ranks(4, ckpt_jobs.write_megatron_fixture, str(model), str(legacy), str(dist_root), timeout=900)
    (source,) = [x for x in out if x is not None]
    files = sorted(p.name for p in (legacy / "iter_0000007").iterdir())
    res: dict[str, Any] = {"legacy_rank_folders": files}
    cases = (("legacy->TP1", legacy, 1), ("dist->TP1", dist_root, 1), ("legacy->TP2", legacy, 2))
    for name, load, tp in cases:
        logits = run_ranks(tp, ckpt_jobs.initial_policy_logits, str(model), str(load), tp, timeout=600)[0]
        res[f"max_logit_diff {name}"] = _max_diff(logits, source)
    return res


def export(root: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from asp_npu.data.init_model import build_model_dir
    from tests.trainer import ckpt_jobs
    from tests.trainer.helpers import run_ranks

    model = build_model_dir(root / "tiny", "tiny", seed=0)
    ckpt = root / "run" / "checkpoints"
    trainer_logits = run_ranks(2, ckpt_jobs.trained_checkpoint, str(model), str(ckpt), timeout=900)[0]
    out = root / "hf"
    proc = _cli(["export-hf", str(ckpt), "--out", str(out), "--max-shard-size", "1MB"], root)
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(ckpt_jobs._ids()).logits
    index = json.loads((out / "model.safetensors.index.json").read_text())
    return {"export_stdout": proc.stdout.strip(), "files": sorted(p.name for p in out.iterdir()),
            "shards": len(set(index["weight_map"].values())), "total_size": index["metadata"]["total_size"],
            "max_logit_diff transformers vs trainer": _max_diff(logits, trainer_logits),
            "greedy": vllm_vs_transformers_greedy(out), "ckpt": str(ckpt)}


def _cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    return subprocess.run([sys.executable, "-m", "asp_npu.cli", *argv], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=600)


def bad_input(root: Path, ckpt: Path, legacy: Path) -> list[dict[str, Any]]:
    import shutil

    torn = root / "torn"
    (torn / "iter_0000002").mkdir(parents=True)
    holes = root / "holes"
    if legacy.is_dir():
        shutil.copytree(legacy, holes)
    else:  # the same layout, written by the unit tests' writer
        from tests.trainer.test_convert import DIMS, _hf_state
        from tests.trainer.test_megatron_ckpt_on_cpu import write_legacy

        write_legacy(holes, _hf_state(DIMS), 2, 2, iteration=7)
    (holes / "iter_0000007" / "mp_rank_01_001" / "model_optim_rng.pt").unlink()
    bad_tp = root / "tp3" / "iter_0000001"
    for t in range(3):
        (bad_tp / f"mp_rank_{t:02d}").mkdir(parents=True)
        (bad_tp / f"mp_rank_{t:02d}" / "model_optim_rng.pt").write_bytes(b"x")
    model = root / "hf"
    if not model.is_dir():
        from tests.trainer.helpers import make_hf_model

        make_hf_model(model, tied=False)
    cases = [
        ["export-hf", str(torn), "--out", str(root / "o1")],
        ["export-hf", str(ckpt), "--step", "9", "--out", str(root / "o2")],
        ["sft", f"model.path={model}", f"model.load_megatron={holes}", "--out", str(root / "o3")],
        ["sft", f"model.path={model}", f"actor_config.load={bad_tp.parent}", "--out", str(root / "o4")],
    ]
    rows = []
    for i, argv in enumerate(cases, 1):
        p = _cli(argv, root)
        rows.append({"argv": " ".join(argv).replace(str(root), "$T"), "rc": p.returncode,
                     "stderr": p.stderr.strip().replace(str(root), "$T"),
                     "lines": len(p.stderr.strip().splitlines()), "out_written": (root / f"o{i}").exists()})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--parts", default="initial,export,bad", help="which parts to measure (comma list)")
    ap.add_argument("--vllm-greedy", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vllm_greedy:
        print(json.dumps(_vllm_greedy(Path(args.vllm_greedy))))
        return
    from asp_npu.device import loopback_env

    os.environ.update(loopback_env())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "in").mkdir()
        (root / "out").mkdir()
        parts = args.parts.split(",")
        result: dict[str, Any] = {}
        if "initial" in parts:
            result["initial_policy"] = initial_policy(root / "in")
            print(json.dumps(result), file=sys.stderr, flush=True)  # each part as soon as it is measured
        if "export" in parts:
            result["export"] = export(root / "out")
            print(json.dumps(result["export"]), file=sys.stderr, flush=True)
        if "bad" in parts:
            ckpt = Path(result.get("export", {}).pop("ckpt", root / "out" / "run" / "checkpoints"))
            result["bad_input"] = bad_input(root / "in", ckpt, root / "in" / "legacy")
    print(json.dumps(result, indent=2 if args.json else None))


if __name__ == "__main__":
    main()
