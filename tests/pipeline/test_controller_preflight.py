"""Bad pipeline configs stop before any actor starts, with one clear message naming the key."""

from __future__ import annotations

import pytest

from asp_npu.config import load_config
from asp_npu.errors import ConfigError
from asp_npu.pipeline.preflight import device_problems, preflight, window_prompts


def _cfg(tmp_path, *overrides):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    base = [f"model.path={model}", "trainer.device=cpu", "generate_config.num_instances=2",
            "rl_config.n_samples_per_prompt=4", "rl_config.mini_batch_size=16"]
    return load_config(None, base + list(overrides), check=False)


def test_good_config_passes(tmp_path):
    assert preflight(_cfg(tmp_path), devices_per_node=2) == "cpu"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rl_config.max_lag=-1", "rl_config.max_lag: must be >= 0"),
        ("data.length_dist=zipf:median=3", "data.length_dist: length distribution 'zipf' is not one of"),
        ("rl_config.weight_refresh_mode=sometimes", "weight_refresh_mode: 'sometimes' is not inflight|drain"),
        ("rl_config.mini_batch_size=18", "rl_config.mini_batch_size: 18 does not hold whole groups"),
        ("generate_config.num_instances=3", "generate_config.num_instances: 3 instances x TP 1 need 3 cores"),
        ("rl_config.global_batch_size=6", "not a whole number of minibatches of 16"),
        ("rl_config.predictor=oracle", "rl_config.predictor: 'oracle' cannot run online"),
        ("rl_config.mode=verl-sync", "rl_config.mode: 'verl-sync' runs only in the simulator"),
        ("actor_config.cpu_cores=1-3", "actor_config.cpu_cores: '1-3' is not a comma-separated list"),
    ],
)
def test_bad_config_names_the_key(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        preflight(_cfg(tmp_path, override), devices_per_node=2)


def test_missing_or_non_model_path(tmp_path):
    with pytest.raises(ConfigError, match="model.path: '.*nope' does not exist"):
        preflight(_cfg(tmp_path, f"model.path={tmp_path / 'nope'}", "model.build_if_missing=false"), 2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="is not an HF model folder"):
        preflight(_cfg(tmp_path, f"model.path={tmp_path / 'empty'}"), 2)


def test_all_problems_in_one_message(tmp_path):
    with pytest.raises(ConfigError) as err:
        preflight(_cfg(tmp_path, "rl_config.max_lag=-2", "generate_config.num_instances=5"), 2)
    assert "max_lag" in str(err.value) and "num_instances" in str(err.value)
    assert "\n" not in str(err.value)


def test_accelerators_split_devices_unless_colocated(tmp_path):
    cfg = _cfg(tmp_path, "generate_config.num_instances=8", "actor_config.tensor_model_parallel_size=2")
    assert any("rollout + 2 trainer" in p for p in device_problems(cfg, "npu", 8))
    cfg.rl_config.mode = "mindspeed-sync"
    assert device_problems(cfg, "npu", 8) == []


def test_window_prompts(tmp_path):
    assert window_prompts(_cfg(tmp_path)) == 4
    assert window_prompts(_cfg(tmp_path, "rl_config.global_batch_size=12")) == 12


def test_train_cli_rejects_before_any_actor(tmp_path, capsys):
    """The CLI prints one line and exits 2; no run directory is created."""
    from asp_npu.cli import main

    run = tmp_path / "run"
    rc = main(["train", f"trainer.run_dir={run}", "rl_config.max_lag=-1", "trainer.device=cpu"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rl_config.max_lag: must be >= 0" in err[0]
    assert not run.exists()


def test_resume_needs_an_iteration_boundary_with_steps_left(tmp_path):
    import json

    from asp_npu.trainer.checkpoint import SCHEMA

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()

    def at(step):
        meta = {"schema": SCHEMA, "iteration": "iter_1", "step": step}
        (ckpt / "iter_1").mkdir(exist_ok=True)
        (ckpt / "iter_1" / "trainer.json").write_text(json.dumps(meta))  # a trainer-only checkpoint
        (ckpt / "latest.json").write_text(json.dumps(meta))
        return _cfg(tmp_path, f"actor_config.load={ckpt}", "rl_config.global_batch_size=8",
                    "trainer.train_iters=5")

    assert preflight(at(4), devices_per_node=2) == "cpu"  # 2 steps per iteration: step 4 ends iteration 2
    with pytest.raises(ConfigError, match="is at step 3; a run resumes at an iteration boundary"):
        preflight(at(3), devices_per_node=2)
    with pytest.raises(ConfigError, match="nothing left to train"):
        preflight(at(10), devices_per_node=2)
    with pytest.raises(ConfigError, match="holds no trainer checkpoint"):
        preflight(_cfg(tmp_path, f"actor_config.load={tmp_path / 'none'}"), devices_per_node=2)
