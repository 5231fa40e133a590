"""MindSpeed-RL's grpo_lora config and verl's LoRA keys import to actor_config's LoRA keys, and `check`
sizes the frozen base without gradients or optimizer state (memory by component)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asp_npu.cli import main as cli_main
from asp_npu.config import load_config, validate
from asp_npu.deploy.arch import resolve_arch
from asp_npu.deploy.import_config import translate_verl_lora
from asp_npu.deploy.layout import card_for
from asp_npu.deploy.memory import lora_params, stage_memory, stage_params
from asp_npu.errors import UserError

FIXTURE = Path(__file__).parent / "fixtures" / "grpo_lora_qwen25_32b_A2.yaml"


@pytest.fixture
def imported(tmp_path, capsys):
    out = tmp_path / "ours.yaml"
    args = ["import-config", "mindspeed-rl", str(FIXTURE), "--out", str(out), "--mode", "mindspeed-sync"]
    assert cli_main(args) == 0
    printed = capsys.readouterr().out
    return out, printed


def test_grpo_lora_imports_and_passes_check_on_its_own_cluster(imported, capsys):
    out, printed = imported
    cfg = load_config(str(out), check=False)
    act = cfg.actor_config
    assert (act.lora_r, act.lora_alpha) == (128, 128.0)
    assert act.lora_target_modules == ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
    assert "lora_fusion" in printed and "only the adapters" in printed
    assert [p for p in validate(cfg) if not p.startswith(("model.path", "model.load_megatron"))] == []
    assert cli_main(["check", "--config", str(out), 'model.load_megatron=""', "--no-sim"]) == 0
    text = capsys.readouterr().out
    assert "LoRA r128: 90.7M adapter params per rank train, the base is frozen" in text
    assert "OK:" in text


def test_the_frozen_base_has_no_gradients_or_optimizer_state(imported):
    out, _ = imported
    cfg = load_config(str(out), check=False)
    arch, card = resolve_arch(cfg)[0], card_for("a2")
    assert arch is not None
    lora = stage_memory(cfg, arch, card, 0).parts
    sp = stage_params(cfg, arch, 0)
    adapters = lora_params(cfg, arch, sp)
    # by hand, Qwen2.5-32B at TP4, r 128, 16 layers per stage: qkv r(h + (q+2kv)/4), proj r(q/4 + h),
    # fc1 r(h + 2 ffn/4), fc2 r(ffn/4 + h)
    h, q, kv, ffn, r = 5120, 5120, 1024, 27648, 128
    assert adapters == 16 * r * ((h + (q + 2 * kv) / 4) + (q / 4 + h) + (h + 2 * ffn / 4) + (ffn / 4 + h))
    cfg.actor_config.lora_r, cfg.actor_config.lora_target_modules = 0, []
    full = stage_memory(cfg, arch, card, 0).parts
    gib = 1 << 30
    assert lora["gradients"] == pytest.approx(adapters * 4 / gib)
    assert lora["optimizer"] == pytest.approx(adapters * 12 / gib)  # bf16: fp32 master + 2 Adam moments
    assert lora["weights"] == pytest.approx(full["weights"] + adapters * 2 / gib)
    assert full["gradients"] > 20 * lora["gradients"] and full["optimizer"] > 20 * lora["optimizer"]


def test_verl_lora_keys_map_to_megatron_layers():
    tr = translate_verl_lora({"lora_rank": 32, "lora_alpha": 64, "target_modules": ["q_proj", "v_proj",
                                                                                     "down_proj"]})
    assert tr.out["actor_config"] == {"lora_r": 32, "lora_alpha": 64.0,
                                      "lora_target_modules": ["linear_qkv", "linear_fc2"]}
    assert any("linear_qkv" in n for n in tr.notes)
    tr = translate_verl_lora({"lora_rank": 8, "target_modules": "all-linear"})
    assert tr.out["actor_config"]["lora_target_modules"] == ["linear_qkv", "linear_proj", "linear_fc1",
                                                             "linear_fc2"]
    assert translate_verl_lora({"lora_rank": 0, "lora_alpha": 16}).out == {}
    with pytest.raises(UserError, match="target_modules: 'lm_head'"):
        translate_verl_lora({"lora_rank": 8, "target_modules": ["lm_head"]})


def test_grpo_lora_imports_in_mode_asp_with_the_searched_split(tmp_path, capsys):
    """The file's `load: ./` (model.load_megatron) names a folder that exists wherever the import runs
    and is no checkpoint: the search judges splits without it (`check` still reads it), so the frozen
    base's small trainer finds its split: TP4 x PP3 beside TP2 instances on the 16 A2 NPUs."""
    out = tmp_path / "asp.yaml"
    assert cli_main(["import-config", "mindspeed-rl", str(FIXTURE), "--out", str(out)]) == 0, \
        capsys.readouterr().err
    cfg = load_config(str(out), check=False)
    act, gen = cfg.actor_config, cfg.generate_config
    assert cfg.rl_config.mode == "asp" and act.lora_r == 128 and cfg.model.load_megatron == "./"
    assert (act.tensor_model_parallel_size, act.pipeline_model_parallel_size) == (4, 3)
    assert act.tensor_model_parallel_size * act.pipeline_model_parallel_size * act.data_parallel_size \
        + gen.num_instances * gen.infer_tensor_parallel_size <= 16
    capsys.readouterr()
    assert cli_main(["check", "--config", str(out), 'model.load_megatron=""', "--no-sim"]) == 0
