"""`asp-npu import-config verl`: verl GRPO/DAPO example override sets (tests/fixtures/verl, the values of
verl's examples) import to the asp-npu keys that honour them and pass `asp-npu check`; a key asp-npu does not
know or cannot run is one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from asp_npu.cli import main as cli_main
from asp_npu.config import Config, load_config
from asp_npu.deploy.import_verl import flatten_verl, translate_verl

FIXTURES = Path(__file__).parents[1] / "fixtures" / "verl"
COLOCATED = ["--mode", "mindspeed-sync"]  # verl's hybrid engine; no layout search (fast)


def _import(tmp_path: Path, src: Path, capsys, *extra: str) -> tuple[int, Config | None, str]:
    out = tmp_path / "ours.yaml"
    try:
        rc = cli_main(["import-config", "verl", str(src), "--out", str(out), *(extra or COLOCATED)])
    except SystemExit as exc:
        rc = int(exc.code or 0)
    printed = capsys.readouterr()
    cfg = load_config(str(out), check=False) if rc == 0 else None
    return rc, cfg, printed.out + printed.err


def _write(tmp_path: Path, keys: dict) -> Path:
    p = tmp_path / "verl.yaml"
    p.write_text(yaml.safe_dump(keys))
    return p


def test_qwen3_8b_gsm8k_example(tmp_path: Path, capsys) -> None:
    rc, cfg, printed = _import(tmp_path, FIXTURES / "grpo_qwen3_8b_gsm8k.yaml", capsys)
    assert rc == 0 and cfg is not None
    rl, sc = cfg.rl_config, cfg.generate_config.sampling_config
    assert (rl.adv_estimator, rl.n_samples_per_prompt, rl.global_batch_size) == ("group_norm", 5, 1024)
    assert rl.mini_batch_size == 256 * 5  # verl counts prompts, asp-npu samples
    assert (rl.kl_coef, rl.kl_penalty, rl.use_kl_in_reward) == (0.001, "low_var_kl", False)
    assert (rl.clip_ratio_low, rl.clip_ratio_high, rl.clip_ratio_c) == (0.2, 0.2, 3.0)  # verl's defaults
    assert (rl.max_prompt_length, sc.max_tokens, sc.top_k) == (512, 1024, -1)
    assert cfg.actor_config.lr == 1e-6 and cfg.actor_config.weight_decay == 0.01  # verl's AdamW default
    assert cfg.model.path == "Qwen/Qwen3-8B" and cfg.model.arch.num_layers == 36
    assert (cfg.trainer.test_freq, cfg.trainer.save_freq, cfg.data.val_files) == (
        5,
        20,
        "~/data/gsm8k/test.parquet",
    )
    assert cfg.trainer.logger == ["jsonl", "console", "wandb"]
    assert "not mapped: trainer.total_epochs: verl runs rows // data.train_batch_size x 15 steps" in printed
    # the layout it chose passes the check (the data files live on the cluster: a local stand-in here)
    val = tmp_path / "val.jsonl"
    val.write_text(
        '{"prompt": "1+1?", "data_source": "openai/gsm8k", "reward_model": {"ground_truth": "2"}}\n'
    )
    assert (
        cli_main(
            [
                "check",
                "--config",
                str(tmp_path / "ours.yaml"),
                "--no-sim",
                f"data.val_files={val}",
                "trainer.train_iters=100",
            ]
        )
        == 0
    )


def test_nested_and_dotted_files_translate_alike(tmp_path: Path) -> None:
    raw = yaml.safe_load((FIXTURES / "grpo_qwen25_7b_npu.yaml").read_text())
    dotted = flatten_verl(raw)
    assert dotted["actor_rollout_ref.actor.optim.lr"] == 5e-8
    src = Path("grpo_qwen25_7b_npu.yaml")
    a, b = translate_verl(raw, src, mode="mindspeed-sync"), translate_verl(dotted, src, mode="mindspeed-sync")
    assert a.out == b.out and sorted(a.mapped) == sorted(b.mapped) and a.unmapped == b.unmapped
    assert a.out["trainer"]["device"] == "npu" and a.out["trainer"]["save_freq"] == 0  # verl -1: never


def test_dapo_example_maps_dynamic_sampling_and_overlong(tmp_path: Path, capsys) -> None:
    rc, cfg, printed = _import(tmp_path, FIXTURES / "dapo_qwen3_32b_npu.yaml", capsys)
    assert rc == 0 and cfg is not None
    rl = cfg.rl_config
    assert rl.drop_equal_reward_groups and rl.filter_groups_max_batches == 10
    assert (
        rl.filter_groups_metric == "score"
    )  # verl's acc: the verifiers' verdict before the overlong penalty
    assert (rl.overlong_buffer_enable, rl.overlong_buffer, rl.overlong_buffer_penalty_factor) == (
        True,
        4096,
        1.0,
    )
    assert (rl.clip_ratio_low, rl.clip_ratio_high, rl.clip_ratio_c, rl.kl_coef) == (0.2, 0.28, 10.0, 0.0)
    assert cfg.actor_config.lr_warmup_iters == 10 and cfg.actor_config.weight_decay == 0.1
    assert cfg.actor_config.use_dynamic_bsz and cfg.generate_config.val_kwargs.top_p == 0.7
    assert "not mapped: data.gen_batch_size:" in printed


@pytest.mark.parametrize(
    ("metric", "ours"),
    [("acc", "score"), ("score", "score"), ("seq_reward", "reward"), ("seq_final_reward", "reward")],
)
def test_verl_filter_metrics(tmp_path: Path, metric: str, ours: str) -> None:
    keys = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.filter_groups.enable": True,
        "algorithm.filter_groups.metric": metric,
        "actor_rollout_ref.rollout.n": 4,
    }
    tr = translate_verl(keys, tmp_path / "x.yaml", mode="mindspeed-sync")
    assert tr.out["rl_config"]["filter_groups_metric"] == ours


@pytest.mark.parametrize(
    ("keys", "line"),
    [
        ({"algorithm.adv_estimator": "gae"}, "cannot import: algorithm.adv_estimator='gae': only grpo"),
        ({}, "cannot import: algorithm.adv_estimator='gae'"),  # verl's default: PPO with a critic
        (
            {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.model.lora_rank": 64},
            "LoRA training is not",
        ),
        (
            {
                "algorithm.adv_estimator": "grpo",
                "actor_rollout_ref.actor.use_kl_loss": True,
                "algorithm.use_kl_in_reward": True,
            },
            "both on: asp-npu applies one KL term",
        ),
        (
            {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.actor.policy_loss.loss_mode": "gspo"},
            "only verl's vanilla (PPO-clip) policy loss",
        ),
        (
            {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.quantization": "fp8"},
            "actor_rollout_ref.rollout.quantization: a verl key asp-npu does not know or support",
        ),
        (
            {"algorithm.adv_estimator": "grpo", "algorithm.filter_groups.metric": "pred"},
            "algorithm.filter_groups.metric=pred: asp-npu filters on",
        ),
        (
            {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": "five"},
            "actor_rollout_ref.rollout.n: expected an integer, got 'five'",
        ),
        (
            {"algorithm.adv_estimator": "grpo", "trainer.critic_warmup": "abc"},
            "trainer.critic_warmup: unexpected value",
        ),
        (
            {"algorithm.adv_estimator": "grpo", "data.val_files": ["a.parquet", "b.parquet"]},
            "data.val_files: 2 files; asp-npu reads one",
        ),
        ({"rl_config": {"mode": "asp"}, "trainer": {"nnodes": 1}}, "rl_config: not a verl section"),
    ],
)
def test_unknown_or_unsupported_is_one_line_exit_2(tmp_path: Path, capsys, keys, line) -> None:
    rc, _, printed = _import(tmp_path, _write(tmp_path, {"data.train_batch_size": 8, **keys}), capsys)
    errors = [x for x in printed.splitlines() if "error" in x]
    assert rc == 2 and len(errors) == 1 and line in errors[0]
    assert not (tmp_path / "ours.yaml").exists()


def test_lora_example_is_refused(tmp_path: Path, capsys) -> None:
    rc, _, printed = _import(tmp_path, FIXTURES / "grpo_qwen25_3b_gsm8k_lora.yaml", capsys)
    assert rc == 2 and "actor_rollout_ref.model.lora_rank=64: LoRA training is not supported" in printed


def test_truncated_sampling_switches_the_correction_off(tmp_path: Path) -> None:
    keys = {
        "algorithm.adv_estimator": "grpo",
        "actor_rollout_ref.rollout.top_k": 50,
        "actor_rollout_ref.rollout.n": 4,
    }
    tr = translate_verl(keys, tmp_path / "x.yaml", mode="mindspeed-sync")
    assert tr.out["generate_config"]["sampling_config"]["top_k"] == 50
    assert tr.out["rl_config"]["importance_cap"] == 0.0


def test_train_iters_from_a_local_training_file(tmp_path: Path) -> None:
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join('{"prompt": "q", "data_source": "openai/gsm8k"}\n' for _ in range(50)))
    keys = {
        "algorithm.adv_estimator": "grpo",
        "data.train_files": str(rows),
        "data.train_batch_size": 16,
        "trainer.total_epochs": 3,
        "actor_rollout_ref.rollout.n": 2,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
    }
    tr = translate_verl(keys, tmp_path / "x.yaml", mode="mindspeed-sync")
    assert tr.out["trainer"]["train_iters"] == 50 // 16 * 3  # verl drops the last partial batch
    assert "trainer.total_epochs" in tr.mapped
