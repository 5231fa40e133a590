"""The trainer's optimizer: megatron's lr schedule stepped per optimizer step and resumed from the
checkpoint, Adam settings from config, host-resident optimizer state (HybridDeviceOptimizer on CPU),
their imports from MindSpeed-RL / verl and the bad input that is refused before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.config import Config, load_config, validate
from asp_npu.deploy.import_config import translate_verl_actor
from asp_npu.errors import ConfigError
from asp_npu.trainer.optim import scheduler_values, steps_per_iteration
from tests.trainer import jobs
from tests.trainer.helpers import make_hf_model, run_ranks

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ bad input: one line, exit 2
BAD = {
    "warm-up longer than the run": (["trainer.train_iters=4", "actor_config.lr_warmup_iters=6"],
                                    "actor_config.lr_warmup_iters: a warm-up of 6 iterations"),
    "warm-up as long as the decay": (["trainer.train_iters=10", "actor_config.lr_decay_iters=3",
                                      "actor_config.lr_warmup_iters=3"], "is not shorter than the decay"),
    "unknown decay style": (["actor_config.lr_decay_style=step"],
                            "actor_config.lr_decay_style: 'step' is not constant|linear|cosine"),
    "min_lr above lr": (["actor_config.lr=1e-6", "actor_config.min_lr=1e-5"],
                        "actor_config.min_lr: 1e-05 is above lr 1e-06"),
    "warm-up fraction of 1": (["actor_config.lr_warmup_fraction=1.0"], "actor_config.lr_warmup_fraction"),
    "beta2 of 1": (["actor_config.adam_beta2=1.0"], "actor_config.adam_beta2"),
    "offload without the distributed optimizer": (["actor_config.optimizer_cpu_offload=true"],
                                                  "needs actor_config.use_distributed_optimizer=true"),
    "offload fraction above 1": (["actor_config.use_distributed_optimizer=true",
                                  "actor_config.optimizer_cpu_offload=true",
                                  "actor_config.optimizer_offload_fraction=1.5"],
                                 "actor_config.optimizer_offload_fraction: must be in [0, 1]"),
    "offload fraction below 0": (["actor_config.optimizer_offload_fraction=-0.5"],
                                 "actor_config.optimizer_offload_fraction: must be in [0, 1]"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_schedule_and_offload_are_refused_by_validate(case: str) -> None:
    overrides, message = BAD[case]
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config(overrides=overrides)


@pytest.mark.parametrize("case", ["warm-up longer than the run", "offload without the distributed optimizer",
                                  "offload fraction above 1"])
def test_bad_input_exits_2_with_one_line(tmp_path: Path, case: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("trainer:\n  device: cpu\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    r = subprocess.run([sys.executable, "-m", "asp_npu.cli", "train", "--config", str(cfg), *BAD[case][0]],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and BAD[case][1].split(":")[0] in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_defaults_are_valid_and_keep_the_constant_lr() -> None:
    cfg = Config()
    assert validate(cfg) == []
    v = scheduler_values(cfg)
    assert v["lr_decay_style"] == "constant" and v["lr_warmup_steps"] == 0
    assert v["init_lr"] == v["max_lr"] == cfg.actor_config.lr


@settings(max_examples=60, deadline=None)
@given(iters=st.integers(1, 50), frac=st.floats(0, 0.99), epochs=st.integers(1, 4),
       groups=st.integers(1, 4), window=st.integers(1, 4))
def test_schedule_lengths_are_iterations_times_optimizer_steps(iters: int, frac: float, epochs: int,
                                                                groups: int, window: int) -> None:
    """Warm-up and decay are in iterations; one iteration is (trainer steps per window) x ppo_epochs
    optimizer steps; megatron's own invariant (warm-up shorter than the decay) holds when validate passes."""
    cfg = Config()
    cfg.trainer.train_iters = iters
    cfg.actor_config.lr_warmup_fraction, cfg.actor_config.ppo_epochs = frac, epochs
    cfg.rl_config.n_samples_per_prompt, cfg.rl_config.mini_batch_size = 4, 4 * groups
    cfg.rl_config.global_batch_size = groups * window
    v = scheduler_values(cfg)
    per = steps_per_iteration(cfg)
    assert per == window * epochs
    assert v["lr_decay_steps"] == iters * per and v["lr_warmup_steps"] == pytest.approx(frac * iters * per)
    if not validate(cfg):
        assert v["lr_warmup_steps"] < v["lr_decay_steps"]


# ------------------------------------------------------------------ imports
def test_verl_actor_optim_keys_import() -> None:
    tr = translate_verl_actor({"ppo_epochs": 2, "shuffle": False, "grad_clip": 0.5,
                               "optim": {"lr": 2e-6, "lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.1,
                                         "warmup_style": "cosine", "min_lr_ratio": 0.1,
                                         "betas": [0.9, 0.95], "weight_decay": 0.01,
                                         "total_training_steps": -1, "clip_grad": 1.0}})
    act = tr.out["actor_config"]
    assert act == {"lr": 2e-6, "lr_warmup_fraction": 0.1, "lr_decay_style": "cosine",
                   "min_lr": pytest.approx(2e-7), "adam_beta1": 0.9, "adam_beta2": 0.95, "weight_decay": 0.01,
                   "clip_grad": 0.5, "ppo_epochs": 2}
    assert [k for k, _ in tr.unmapped] == ["actor_rollout_ref.actor.shuffle"]
    assert not validate(load_config(overrides=[f"actor_config.{k}={v}" for k, v in act.items()], check=False))


def test_mindspeed_epochs_and_default_decay_import(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from asp_npu.deploy.import_config import translate

    fixture = ROOT / "tests" / "deploy" / "fixtures" / "grpo_qwen25_7b_A3.yaml"
    ms = OmegaConf.to_container(OmegaConf.load(fixture))
    ms["rl_config"]["epochs"] = 2
    del ms["actor_config"]["lr_decay_style"]
    tr = translate(ms, fixture, mode="mindspeed-sync")
    act = tr.out["actor_config"]
    assert act["ppo_epochs"] == 2 and "rl_config.epochs" in tr.mapped
    assert act["lr_decay_style"] == "linear"  # MindSpeed-RL's default when the file leaves it out
    assert act["adam_beta2"] == 0.95


# ------------------------------------------------------------------ real megatron runs (gloo, CPU)
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_hf_model(tmp_path_factory.mktemp("optim") / "hf", tied=True))


@pytest.mark.slow
def test_lr_per_step_is_megatrons_schedule_and_resumes(model_dir: str, tmp_path: Path) -> None:
    r = run_ranks(1, jobs.schedule_and_resume, model_dir, str(tmp_path / "ckpt"), timeout=600)[0]
    assert r["lrs"] == r["reference"]  # exact: megatron's scheduler driven by the same values
    assert r["lrs"][0] == 0.0 and max(r["lrs"]) == pytest.approx(1e-3) and r["lrs"][-1] > 1e-4
    assert r["resumed_lrs"] == r["lrs"][4:6] and r["resumed_losses"] == r["losses"][4:6]
    assert r["epoch_steps"] == 2 * 3  # ppo_epochs=2: the schedule advances per optimizer step


@pytest.mark.slow
def test_host_offload_trains_as_without_it(model_dir: str) -> None:
    setups = {"plain": {"use_distributed_optimizer": True},
              **{f"offload {f}": {"use_distributed_optimizer": True, "optimizer_cpu_offload": True,
                                  "optimizer_offload_fraction": f} for f in (1.0, 0.5)}}
    r = run_ranks(1, jobs.training_parity, model_dir, setups, timeout=600)[0]
    plain = r["plain"]
    for name in ("offload 1.0", "offload 0.5"):
        assert np.allclose(r[name]["losses"], plain["losses"], atol=1e-5, rtol=0)
        assert max(float(np.abs(a[k] - b[k]).max()) for a, b in zip(r[name]["grads"], plain["grads"],
                                                                    strict=True) for k in a) < 1e-5
    assert plain["optimizer_bytes"] == {"device": plain["bytes"]["optimizer"], "host": 0}
    full, half = r["offload 1.0"]["optimizer_bytes"], r["offload 0.5"]["optimizer_bytes"]
    assert full["device"] == r["offload 1.0"]["bytes"]["optimizer"] == 0 < full["host"]
    assert 0 < half["device"] < plain["bytes"]["optimizer"] and 0 < half["host"] < full["host"]


@pytest.mark.slow
def test_host_offload_resumes_from_a_checkpoint(model_dir: str, tmp_path: Path) -> None:
    r = run_ranks(1, jobs.offload_resume, model_dir, str(tmp_path / "ckpt"), 0.5, timeout=600)[0]
    assert r["resumed"] == r["uninterrupted"]
