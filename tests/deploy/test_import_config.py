"""`asp-npu import-config mindspeed-rl`: a config written from MindSpeed-RL's documented keys
translates into one that `asp-npu check` accepts, and every key that could not be mapped is named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from asp_npu.cli import main as cli_main
from asp_npu.config import load_config
from asp_npu.deploy.import_config import card_from_name

FIXTURE = Path(__file__).parent / "fixtures" / "grpo_qwen25_7b_A3.yaml"


def test_import_then_check_accepts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ours.yaml"
    assert cli_main(["import-config", "mindspeed-rl", str(FIXTURE), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for key in (
        "megatron_training.use_flash_attn",
        "megatron_training.seq_length",
        "rl_config.partial_rollout_max_split",
        "generate_config.offload_train_param",
        "generate_config.trust_remote_code",
    ):
        assert f"not mapped: {key}:" in printed, key
        assert f"#   {key}:" in out.read_text(), key
    assert "not mapped: actor_config.adam_beta" not in printed
    assert "not mapped: rl_config.epochs" not in printed
    cfg = load_config(str(out), check=False)
    act = cfg.actor_config
    assert (act.adam_beta1, act.adam_beta2, act.weight_decay) == (0.9, 0.95, 0.01)
    assert act.lr_decay_style == "constant" and act.ppo_epochs == 1
    assert cfg.rl_config.mini_batch_size == 32 * 8  # MindSpeed-RL counts prompts, we count samples
    assert cfg.rl_config.global_batch_size == 32 and cfg.rl_config.n_samples_per_prompt == 8
    assert cfg.rl_config.kl_coef == 0.001 and cfg.rl_config.kl_penalty == "low_var_kl"
    assert cfg.reward.verifier_function == ["base_acc"] and cfg.reward.verifier_weight == [1.0]
    # the layout search chose the split: trainer TP/PP and instance TP divide the heads and a node
    act, gen = cfg.actor_config, cfg.generate_config
    assert 28 % act.tensor_model_parallel_size == 0 and 28 % gen.infer_tensor_parallel_size == 0
    assert "layout search:" in printed and "colocated baseline" in printed
    assert (
        cfg.model.path == "./Qwen2.5-7B" and cfg.model.dtype == "bfloat16" and cfg.model.arch.num_layers == 28
    )
    assert cfg.trainer.card == "a3" and cfg.trainer.n_devices_per_node == 16  # from the _A3 file name
    # the 16 NPUs of actor_resource are split between rollout instances and the trainer
    rollout = cfg.generate_config.num_instances * cfg.generate_config.infer_tensor_parallel_size
    trainer = (act.tensor_model_parallel_size * act.pipeline_model_parallel_size * act.context_parallel_size
               * act.data_parallel_size)
    assert rollout + trainer <= 16 and rollout >= 1 and trainer >= 1
    capsys.readouterr()
    assert cli_main(["check", "--config", str(out)]) == 0, capsys.readouterr().err
    assert "asp / mindspeed-sync throughput:" in capsys.readouterr().out  # the full check, estimate included


def test_colocated_import_keeps_mindspeed_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sync.yaml"
    assert (
        cli_main(
            ["import-config", "mindspeed-rl", str(FIXTURE), "--out", str(out), "--mode", "mindspeed-sync"]
        )
        == 0
    )
    cfg = load_config(str(out), check=False)
    assert cfg.rl_config.mode == "mindspeed-sync" and cfg.rl_config.max_lag == 0
    assert cfg.generate_config.num_instances == 4 and cfg.actor_config.data_parallel_size == 4
    assert cfg.generate_config.gpu_memory_utilization == 0.4  # shares NPUs with training: kept as written
    capsys.readouterr()
    assert cli_main(["check", "--config", str(out), "--no-sim"]) == 0, capsys.readouterr().err


def test_model_yaml_next_to_the_config_wins(tmp_path: Path) -> None:
    shutil.copy(FIXTURE, tmp_path / "grpo_custom_A2.yaml")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "qwen25_7b.yaml").write_text(
        "qwen25_7b:\n  num_layers: 4\n  hidden_size: 512\n  ffn_hidden_size: 1024\n  num_attention_heads: 8\n"
        "  group_query_attention: true\n  num_query_groups: 2\n  padded_vocab_size: 1000\n"
        "  max_position_embeddings: 8192\n  untie_embeddings_and_output_weights: true\n"
    )
    out = tmp_path / "ours.yaml"
    assert (
        cli_main(["import-config", "mindspeed-rl", str(tmp_path / "grpo_custom_A2.yaml"), "--out", str(out)])
        == 0
    )
    cfg = load_config(str(out), check=False)
    assert (cfg.model.arch.num_layers, cfg.model.arch.num_key_value_heads, cfg.model.arch.vocab_size) == (
        4,
        2,
        1000,
    )
    assert cfg.trainer.card == "910b" and cfg.trainer.n_devices_per_node == 8 and cfg.trainer.nnodes == 2


def test_not_a_mindspeed_config_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text(OmegaConf.to_yaml(OmegaConf.create({"trainer": {"nnodes": 1}})))
    out = tmp_path / "o.yaml"
    assert cli_main(["import-config", "mindspeed-rl", str(bad), "--out", str(out)]) == 2
    assert "not a MindSpeed-RL GRPO config" in capsys.readouterr().err
    assert not out.exists()
    assert cli_main(["import-config", "verl", str(FIXTURE), "--out", str(out)]) == 2


def test_card_from_file_name() -> None:
    assert card_from_name("configs/grpo_qwen25_7b_A3.yaml") == "a3"
    assert card_from_name("grpo_qwen25_32b_A2_20k.yaml") == "a2"
    assert card_from_name("grpo_trainer_qwen25_7b.yaml") is None


FIXTURES = FIXTURE.parent


def test_ppo_with_a_critic_imports_and_check_lists_the_critic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """MindSpeed-RL's critic_config maps to ours (its layout, optimizer), gamma / lam / cliprange_value
    to rl_config; `check` lists the critic's memory rows beside the trainer's and passes."""
    out = tmp_path / "o.yaml"
    src = FIXTURES / "ppo_critic_demo_A2.yaml"
    rc = cli_main(["import-config", "mindspeed-rl", str(src), "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    cfg = load_config(str(out), check=False)
    assert cfg.rl_config.adv_estimator == "gae"
    assert cfg.critic_config.tensor_model_parallel_size == 4
    assert cfg.critic_config.data_parallel_size == 0  # fills the trainer's ranks it is colocated with
    capsys.readouterr()
    assert cli_main(["check", "--config", str(out), "--no-sim"]) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "\ncritic" in text and "\ntrainer" in text and "PPO critic colocated" in text


@pytest.mark.parametrize(("override", "expected"), [
    ("critic_config.tensor_model_parallel_size=3", "critic_config"),
    ("rl_config.norm_adv_by_std_in_grpo=false", "rl_config.norm_adv_by_std_in_grpo: a group_norm"),
    ("critic_config.lr=1e-6", None),  # fine with gae ...
])
def test_bad_critic_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str,
                                      expected: str | None) -> None:
    out = tmp_path / "o.yaml"
    src = FIXTURES / "ppo_critic_demo_A2.yaml"
    assert cli_main(["import-config", "mindspeed-rl", str(src), "--out", str(out)]) == 0
    capsys.readouterr()
    rc = cli_main(["check", "--config", str(out), "--no-sim", override])
    err = capsys.readouterr().err.strip().splitlines()
    if expected is None:
        assert rc == 0, err
        return
    assert rc == 2 and any(expected in line for line in err), err


def test_critic_keys_without_gae_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.yaml"
    assert cli_main(["import-config", "mindspeed-rl", str(FIXTURE), "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli_main(["check", "--config", str(out), "--no-sim", "critic_config.lr=1e-6"]) == 2
    err = capsys.readouterr().err
    assert "critic_config.lr: only used by PPO with a critic" in err


def test_split_that_cannot_fit_names_the_mode_that_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """16 A3 NPUs hold MindSpeed's TP4 x DP2 (EP2) trainer beside an EP8 instance only with another
    trainer layout: the layout search finds one (DP8, part of the optimizer state on the host). On 8 NPUs
    an EP8 instance leaves no room for a trainer: the one-line refusal says so."""
    src = FIXTURES / "dapo_moe_demo_A3.yaml"
    out = tmp_path / "o.yaml"
    assert cli_main(["import-config", "mindspeed-rl", str(src), "--out", str(out)]) == 0
    cfg = load_config(str(out), check=False)
    assert cfg.rl_config.mode == "asp" and cfg.generate_config.infer_expert_parallel_size == 8
    capsys.readouterr()
    assert cli_main(["check", "--config", str(out), "--no-sim"]) == 0, capsys.readouterr().err
    ms = OmegaConf.to_container(OmegaConf.load(src))
    assert isinstance(ms, dict)
    ms["rl_config"]["actor_resource"]["num_npus"] = 8
    small = tmp_path / "dapo_moe_small_A3.yaml"
    small.write_text(OmegaConf.to_yaml(OmegaConf.create(ms)))
    shutil.copytree(FIXTURES / "model", tmp_path / "model")
    assert cli_main(["import-config", "mindspeed-rl", str(small), "--out", str(tmp_path / "s.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("--mode mindspeed-sync fits" in err[0] or "cannot hold a trainer" in err[0]
                              or "a rollout instance takes 8 of the 8 NPUs" in err[0])


def test_every_key_is_mapped_or_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = FIXTURES / "dapo_moe_demo_A3.yaml"
    out = tmp_path / "o.yaml"
    assert (
        cli_main(["import-config", "mindspeed-rl", str(src), "--out", str(out), "--mode", "mindspeed-sync"])
        == 0
    )
    printed = capsys.readouterr().out
    mapped = int(printed.split("mapped ")[1].split(" key")[0])
    unmapped = int(printed.split("could not map ")[1].split()[0])
    ms = OmegaConf.to_container(OmegaConf.load(src))
    leaves = 0
    for top, body in ms.items():
        if top == "defaults":
            continue
        for value in body.values():
            leaves += len(value) if isinstance(value, dict) else 1
    assert mapped + unmapped == leaves
    for key in ("megatron_training.moe_alltoall_overlap_comm",):
        assert f"not mapped: {key}:" in printed
    assert "not mapped: rl_config.token_level_loss" not in printed  # -> rl_config.loss_agg_mode
    # moe_tp_extend_ep (experts over TP4 x EP2, each whole) is megatron's EP8 with expert TP 1
    act = OmegaConf.load(out).actor_config
    assert (act.expert_model_parallel_size, act.expert_tensor_parallel_size) == (8, 1)
    assert OmegaConf.load(out).generate_config.infer_expert_parallel_size == 8  # infer TP1 x EP8


def _variant(tmp_path: Path, actor: dict, training: dict | None = None) -> Path:
    """The 7B fixture with extra MindSpeed layout keys (written here, not a shipped file)."""
    ms = OmegaConf.to_container(OmegaConf.load(FIXTURE))
    ms["actor_config"].update(actor)
    ms["megatron_training"].update(training or {})
    src = tmp_path / "src" / FIXTURE.name
    src.parent.mkdir(exist_ok=True)
    shutil.copytree(FIXTURE.parent / "model", src.parent / "model", dirs_exist_ok=True)
    src.write_text(OmegaConf.to_yaml(OmegaConf.create(ms)))
    return src


@pytest.mark.parametrize(
    ("actor", "stages"),
    [
        ({"pipeline_model_parallel_size": 2, "num_layer_list": "13,15"}, [13, 15]),
        # MindSpeed pads 28 layers to 30 with no-op layers 1 and 29, then splits 15 + 15
        ({"pipeline_model_parallel_size": 2, "num_layers": 30, "noop_layers": "1,29"}, [14, 14]),
        ({"pipeline_model_parallel_size": 4, "num_layers": 32, "noop_layers": "0,1,2,3"}, [4, 8, 8, 8]),
    ],
)
def test_uneven_pipeline_keys_become_num_layer_list(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    actor: dict, stages: list[int]) -> None:
    out = tmp_path / "o.yaml"
    src = _variant(tmp_path, actor)
    assert cli_main(["import-config", "mindspeed-rl", str(src), "--out", str(out), "--mode",
                     "mindspeed-sync"]) == 0
    printed = capsys.readouterr().out
    assert list(load_config(str(out), check=False).actor_config.num_layer_list) == stages
    assert "not mapped: actor_config.noop_layers" not in printed
    assert "not mapped: actor_config.num_layers" not in printed


def test_noop_layers_that_do_not_leave_the_models_layers_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _variant(tmp_path, {"pipeline_model_parallel_size": 2, "num_layers": 30, "noop_layers": "29"})
    cli_main(["import-config", "mindspeed-rl", str(src), "--out", str(tmp_path / "o.yaml"), "--mode",
              "mindspeed-sync"])
    assert "not mapped: actor_config.noop_layers: 30 - 1 no-op layers != the model's 28 layers" in (
        capsys.readouterr().out)


def test_context_parallel_and_swap_optimizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _variant(tmp_path, {"context_parallel_size": 2, "context_parallel_algo": "megatron_cp_algo"},
                   {"swap_optimizer": True, "use_distributed_optimizer": True})
    out = tmp_path / "o.yaml"
    assert cli_main(["import-config", "mindspeed-rl", str(src), "--out", str(out), "--mode",
                     "mindspeed-sync"]) == 0
    printed = capsys.readouterr().out
    act = load_config(str(out), check=False).actor_config
    assert act.context_parallel_size == 2  # swap: megatron's host-resident optimizer, in every mode
    assert act.optimizer_cpu_offload and act.optimizer_offload_fraction == 1.0
    assert not act.offload_train_optimizer  # the state lives on the host already
    assert act.data_parallel_size == 16 // (4 * 2)  # TP4 x CP2 per data-parallel rank
    assert "not mapped: actor_config.context_parallel" not in printed
    # the trainer splits each sequence over the CP ranks: check sizes it and passes
    assert cli_main(["check", "--config", str(out), "--no-sim"]) == 0, capsys.readouterr().err
    assert "context parallel" in capsys.readouterr().out
    asp = tmp_path / "asp.yaml"
    cli_main(["import-config", "mindspeed-rl", str(src), "--out", str(asp), "--mode", "asp"])
    printed = capsys.readouterr().out
    assert "not mapped: megatron_training.swap_optimizer" not in printed  # host offload in mode asp
    assert "HybridDeviceOptimizer" in printed  # offload allowed; the layout search chose its fraction


def test_an_empty_value_is_named_unmapped_not_a_type_error(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    src = _variant(tmp_path, {}, {"tokenizer_name_or_path": None})
    out = tmp_path / "o.yaml"
    assert cli_main(["import-config", "mindspeed-rl", str(src), "--out", str(out), "--mode", "asp"]) == 0
    assert ("not mapped: megatron_training.tokenizer_name_or_path: empty (null) in the file: left at "
            "asp-npu's default") in capsys.readouterr().out
    assert load_config(str(out), check=False).model.path  # asp-npu's default model path
