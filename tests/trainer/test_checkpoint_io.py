"""Checkpoints in and out with real megatron-core ranks over gloo: a TP=2 x PP=2 Megatron checkpoint
(legacy layout and dist checkpoint) as the initial policy of TP=1 / TP=2 trainers, and an RL
checkpoint exported with `asp-npu export-hf` into transformers (and vLLM, in test_export_vllm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer import ckpt_jobs
from tests.trainer.helpers import make_hf_model, run_ranks

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def megatron_fixture(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron")
    model = make_hf_model(root / "hf", tied=False)
    legacy, dist_root = root / "legacy", root / "dist"
    out = run_ranks(4, ckpt_jobs.write_megatron_fixture, str(model), str(legacy), str(dist_root), timeout=600)
    (source,) = [x for x in out if x is not None]
    return model, legacy, dist_root, source


def test_fixture_is_megatron_legacy_layout_at_tp2_pp2(megatron_fixture) -> None:
    _, legacy, dist_root, _ = megatron_fixture
    it = legacy / "iter_0000007"
    assert (legacy / "latest_checkpointed_iteration.txt").read_text() == "7"
    want = [f"mp_rank_{t:02d}_{p:03d}" for t in range(2) for p in range(2)]
    assert sorted(p.name for p in it.iterdir()) == want
    assert (dist_root / "iter_0000007" / "metadata.json").is_file()


@pytest.mark.parametrize("layout", ["legacy", "dist"])
def test_tp2_pp2_checkpoint_is_the_initial_policy_of_a_tp1_run(megatron_fixture, layout) -> None:
    model, legacy, dist_root, source = megatron_fixture
    load = legacy if layout == "legacy" else dist_root
    (logits,) = run_ranks(1, ckpt_jobs.initial_policy_logits, str(model), str(load))
    assert float(abs(logits - source).max()) < 1e-5


def test_tp2_pp2_checkpoint_loads_into_tp2(megatron_fixture) -> None:
    model, legacy, _, source = megatron_fixture
    out = run_ranks(2, ckpt_jobs.initial_policy_logits, str(model), str(legacy), 2)
    assert float(abs(out[0] - source).max()) < 1e-5


def export_cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
           "MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}
    return subprocess.run([sys.executable, "-m", "asp_npu.cli", "export-hf", *argv], cwd=cwd, env=env,
                          text=True, capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from asp_npu.data.init_model import build_model_dir

    root = tmp_path_factory.mktemp("export")
    model = build_model_dir(root / "tiny", "tiny", seed=0)
    ckpt = root / "run" / "checkpoints"
    trainer_logits = run_ranks(2, ckpt_jobs.trained_checkpoint, str(model), str(ckpt), timeout=600)[0]
    proc = export_cli(str(ckpt), "--out", str(root / "hf"), "--max-shard-size", "1MB", cwd=root)
    assert proc.returncode == 0, proc.stderr
    return root, ckpt, root / "hf", trainer_logits


def test_export_is_a_sharded_hf_folder_transformers_loads_with_the_trainers_logits(exported) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, _, out, trainer_logits = exported
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((out / s).is_file() for s in shards)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    assert (out / "generation_config.json").is_file() and (out / "tokenizer.json").is_file()
    assert json.loads((out / "asp_npu_export.json").read_text())["step"] == 2
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(ckpt_jobs._ids()).logits
    assert float(abs(logits.numpy() - trainer_logits).max()) < 1e-5
    AutoTokenizer.from_pretrained(str(out))


def test_export_refuses_torn_checkpoints_and_foreign_folders_writing_nothing(exported) -> None:
    root, ckpt, out, _ = exported
    torn = root / "torn"
    (torn / "iter_0000002").mkdir(parents=True)  # an iteration without trainer.json, no latest.json
    foreign = root / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    cases = [((str(torn), "--out", str(root / "o1")), "no latest.json"),
             ((str(ckpt), "--step", "9", "--out", str(root / "o2")), "iter_0000009 is incomplete or missing"),
             ((str(ckpt), "--out", str(foreign)), "which is not part of a model folder asp-npu wrote")]
    for argv, message in cases:
        proc = export_cli(*argv, cwd=root)
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert not (root / "o1").exists() and not (root / "o2").exists()
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    assert export_cli(str(ckpt), "--out", str(out), cwd=root).returncode == 0  # ours: replaced


def test_exported_folder_generates_in_vllm_as_transformers_greedy(exported) -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks.ckpt_io import vllm_vs_transformers_greedy

    _, _, out, _ = exported
    result = vllm_vs_transformers_greedy(out)
    assert result["equal_tokens"] == result["tokens"] > 0
