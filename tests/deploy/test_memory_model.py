"""`asp-npu check`'s memory model: parameter counts of each family match the published sizes, sharding
sums back to the model, and each megatron-core / MindSpeed-RL setting moves the component it should;
bad parallel settings are refused in one line with exit code 2."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.arch import ModelDims
from asp_npu.cli import main as cli_main
from asp_npu.config import load_config
from asp_npu.deploy.import_config import KNOWN_MODELS
from asp_npu.deploy.layout import card_for, plan_layout
from asp_npu.deploy.memory import (
    instance_memory,
    stage_memory,
    stage_params,
    trainer_memory,
    trainer_resident_gib,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "npu"
FIXTURES = Path(__file__).parent / "fixtures"
A3 = card_for("a3")


def _cfg(model: str, **actor: object) -> object:
    cfg = load_config(str(CONFIGS / "qwen25_7b_a2_1node.yaml"), check=False)
    cfg.model.path = "/nonexistent"
    for k, v in KNOWN_MODELS[model].items():
        setattr(cfg.model.arch, k, v)
    for k, v in actor.items():
        setattr(cfg.actor_config, k, v)
    return cfg


@pytest.mark.parametrize(
    "model,total_b,active_b",
    [
        ("qwen25_7b", 7.62, 7.62),
        ("qwen3_8b", 8.19, 8.19),
        ("qwen3_32b", 32.8, 32.8),
        ("qwen3_30b_a3b", 30.5, 3.3),
        ("qwen3_235b_a22b", 235.1, 22.2),
        ("deepseekv3_671b", 671.0, 37.5),
        ("llama32_1b", 1.24, 1.24),
    ],
)
def test_parameter_counts_match_the_published_sizes(model: str, total_b: float, active_b: float) -> None:
    a = ModelDims(**KNOWN_MODELS[model])
    assert a.params / 1e9 == pytest.approx(total_b, rel=0.01)
    assert a.active_params / 1e9 == pytest.approx(active_b, rel=0.02)


@given(
    tp=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([1, 2, 4]),
    ep=st.sampled_from([1, 2, 4, 8]),
    model=st.sampled_from(["qwen25_7b", "qwen3_30b_a3b", "llama32_1b"]),
)
@settings(max_examples=40, deadline=None)
def test_sharded_parameters_sum_back_to_the_model(tp: int, pp: int, ep: int, model: str) -> None:
    """Every rank's dense part x TP over the PP stages plus its experts x EP x TP is the whole model
    (layer counts that PP divides)."""
    cfg = _cfg(
        model, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep
    )
    a = ModelDims(**KNOWN_MODELS[model])
    stages = [stage_params(cfg, a, s) for s in range(pp)]
    dense = sum(s.dense for s in stages) * tp
    experts = sum(s.experts for s in stages) * tp * ep
    tied_extra = a.embedding_params if (pp > 1 and a.tie_word_embeddings) else 0  # megatron's copy
    assert dense + experts == pytest.approx(a.params + tied_extra, rel=1e-9)


def test_distributed_optimizer_follows_megatrons_bytes_per_parameter() -> None:
    """bf16 with fp32 grads: 18 bytes/param plain, 6 + 12/DP with the distributed optimizer."""
    cfg = _cfg("qwen25_7b", data_parallel_size=4, use_distributed_optimizer=False)
    a = ModelDims(**KNOWN_MODELS["qwen25_7b"])
    plain = trainer_memory(cfg, a, A3)[0].parts
    cfg.actor_config.use_distributed_optimizer = True
    dist = trainer_memory(cfg, a, A3)[0].parts
    per_param = (plain["weights"] + plain["gradients"] + plain["optimizer"]) / plain["weights"] * 2
    assert per_param == pytest.approx(18)
    assert (dist["weights"] + dist["gradients"] + dist["optimizer"]) / dist["weights"] * 2 == pytest.approx(
        6 + 12 / 4
    )


def test_expert_parallelism_shards_experts_and_their_optimizer_over_expert_dp() -> None:
    a = ModelDims(**KNOWN_MODELS["qwen3_30b_a3b"])
    cfg = _cfg(
        "qwen3_30b_a3b",
        tensor_model_parallel_size=4,
        data_parallel_size=4,
        use_distributed_optimizer=True,
        expert_model_parallel_size=1,
    )
    ep1 = stage_params(cfg, a, 0)
    cfg.actor_config.expert_model_parallel_size = 4
    ep4 = stage_params(cfg, a, 0)
    assert ep4.experts == pytest.approx(ep1.experts / 4) and ep4.dense == ep1.dense
    opt = trainer_memory(cfg, a, A3)[0].parts["optimizer"] * 1024**3
    assert opt == pytest.approx(ep4.dense * 12 / 4 + ep4.experts * 12 / 1)  # expert DP = DP / EP = 1


def test_recompute_and_sequence_parallel_shrink_activations() -> None:
    a = ModelDims(**KNOWN_MODELS["qwen25_7b"])
    cfg = _cfg("qwen25_7b", tensor_model_parallel_size=4, sequence_parallel=False, recompute_granularity="")

    def acts() -> float:
        return trainer_memory(cfg, a, A3)[0].parts["activations"]

    none = acts()
    cfg.actor_config.recompute_granularity = "selective"
    assert acts() == pytest.approx(none)  # flash attention stores no s^2 scores: selective saves nothing
    cfg.actor_config.recompute_granularity = ""
    cfg.actor_config.sequence_parallel = True
    sp = acts()
    assert sp < none
    cfg.actor_config.recompute_granularity = "full"
    cfg.actor_config.recompute_num_layers = 1
    full = acts()
    assert full < sp / 5
    cfg.actor_config.recompute_method = "block"
    cfg.actor_config.recompute_num_layers = 14  # half of the 28 layers recomputed
    block = acts()
    assert full < block < sp
    cfg.actor_config.recompute_num_layers = 28
    assert acts() < block


def test_offload_frees_the_rollout_phase_only() -> None:
    a = ModelDims(**KNOWN_MODELS["qwen25_7b"])
    cfg = _cfg("qwen25_7b", tensor_model_parallel_size=4, data_parallel_size=4)
    cfg.rl_config.mode = "mindspeed-sync"
    before = trainer_memory(cfg, a, A3)[0]
    assert trainer_resident_gib(cfg, before) == pytest.approx(
        before.parts["weights"]
        + before.parts["gradients"]
        + before.parts["optimizer"]
        + before.parts["reference"]
    )
    for k in ("offload_train_optimizer", "offload_train_grad", "offload_train_param"):
        setattr(cfg.actor_config, k, True)
    after = trainer_memory(cfg, a, A3)[0]
    assert trainer_resident_gib(cfg, after) == 0.0
    assert after.parts["weights"] == before.parts["weights"]  # still on the NPU while training
    rollout = instance_memory(cfg, a, A3, 0.0)
    assert rollout.total_gib == pytest.approx(cfg.generate_config.gpu_memory_utilization * 64)


def test_rollout_experts_shard_over_infer_expert_parallelism() -> None:
    a = ModelDims(**KNOWN_MODELS["qwen3_30b_a3b"])
    cfg = _cfg("qwen3_30b_a3b")
    cfg.generate_config.infer_tensor_parallel_size = 1
    w1 = instance_memory(cfg, a, A3).parts["weights"]
    cfg.generate_config.infer_expert_parallel_size = 8
    w8 = instance_memory(cfg, a, A3).parts["weights"]
    assert w8 * 1024**3 == pytest.approx((a.dense_params + a.expert_params / 8) * 2)
    assert w8 < w1 / 4


def test_mla_kv_cache_is_the_compressed_latent() -> None:
    a = ModelDims(**KNOWN_MODELS["deepseekv3_671b"])
    assert a.kv_bytes_per_token(2, 8) == a.kv_bytes_per_token(2, 1) == 61 * (512 + 64) * 2


def test_deepseek_is_sized_but_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _cfg("deepseekv3_671b", tensor_model_parallel_size=8, pipeline_model_parallel_size=1)
    lay = plan_layout(cfg, 1, 16, A3)
    assert any("DeepSeek-V3 (multi-latent attention + MoE) is not supported" in p for p in lay.problems)
    assert any(m.role.startswith("trainer") for m in lay.memory)  # still sized


BAD = [
    (
        ["actor_config.expert_model_parallel_size=3", "actor_config.data_parallel_size=3"],
        "does not divide the 128 experts",
    ),
    (
        ["actor_config.sequence_parallel=true", "actor_config.tensor_model_parallel_size=1"],
        "actor_config.sequence_parallel: needs tensor_model_parallel_size > 1",
    ),
    (["rl_config.mode=asp"], "offload only applies when rollout and training share devices"),
    (["model.arch.model_type=gpt_neox"], "model.arch.model_type: 'gpt_neox' is not a known architecture"),
    (
        ["actor_config.expert_model_parallel_size=4", "actor_config.data_parallel_size=2",
         "actor_config.expert_tensor_parallel_size=0"],
        "expert_model_parallel_size=4 x expert tensor parallel size 4 = 16 does not divide TP x CP x DP = 8",
    ),
    (["generate_config.weight_nz_mode=1"], "generate_config.weight_nz_mode: 1 turns on"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[m[:30] for _, m in BAD])
def test_bad_parallel_settings_are_one_line_exit_2(
    overrides: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        cli_main(
            [
                "import-config",
                "mindspeed-rl",
                str(FIXTURES / "dapo_moe_demo_A3.yaml"),
                "--out",
                str(tmp_path / "moe.yaml"),
                "--mode",
                "mindspeed-sync",
            ]
        )
        == 0
    )
    capsys.readouterr()
    rc = cli_main(["check", "--config", str(tmp_path / "moe.yaml"), "--no-sim", *overrides])
    err = capsys.readouterr().err
    assert rc == 2
    hits = [line for line in err.splitlines() if message in line]
    assert len(hits) == 1 and hits[0].startswith("asp-npu check: problem: "), err


def test_nz_in_the_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VLLM_ASCEND_ENABLE_NZ", "1")
    rc = cli_main(["check", "--config", str(CONFIGS / "qwen25_7b_a2_1node.yaml"), "--no-sim"])
    err = capsys.readouterr().err
    assert rc == 2 and "problem: VLLM_ASCEND_ENABLE_NZ=1 in this environment" in err


def test_colocated_moe_fixture_fits_with_offload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "moe.yaml"
    assert (
        cli_main(
            [
                "import-config",
                "mindspeed-rl",
                str(FIXTURES / "dapo_moe_demo_A3.yaml"),
                "--out",
                str(out),
                "--mode",
                "mindspeed-sync",
            ]
        )
        == 0
    )
    cfg = load_config(str(out), check=False)
    assert (  # moe_tp_extend_ep: TP4 x EP2 = megatron EP8, expert TP 1
        cfg.actor_config.expert_model_parallel_size == 8
        and cfg.actor_config.expert_tensor_parallel_size == 1
        and cfg.generate_config.infer_expert_parallel_size == 8
    )
    assert cfg.actor_config.offload_train_param and cfg.actor_config.recompute_num_layers == 2
    assert cfg.model.arch.model_type == "qwen3_moe" and cfg.model.arch.num_experts == 128
    capsys.readouterr()
    rc = cli_main(["check", "--config", str(out), "--no-sim"])
    printed = capsys.readouterr().out
    assert rc == 0
    assert "rollout phase (colocated)" in printed and "trainer_resident" in printed
    for part in ("weights", "gradients", "optimizer", "activations", "kv_cache"):
        assert part in printed
    off = copy.deepcopy(cfg)
    off.actor_config.offload_train_optimizer = False  # Adam state (21 GiB) + fp32 grads (15 GiB) stay
    off.actor_config.offload_train_grad = False  # beside the engine's 0.6 x 64 GiB: over 64
    lay = plan_layout(off, 1, 16, A3)
    assert any("in the rollout phase the trainer keeps" in p for p in lay.problems)


@given(
    nodes=st.integers(1, 6),
    per_node=st.sampled_from([8, 16]),
    iep=st.sampled_from([1, 2, 4, 8, 16, 32, 64]),
    instances=st.integers(1, 8),
    colocated=st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_expert_parallel_instances_take_whole_blocks_without_reuse(
    nodes: int, per_node: int, iep: int, instances: int, colocated: bool
) -> None:
    cfg = _cfg("qwen3_30b_a3b", tensor_model_parallel_size=4, data_parallel_size=1)
    cfg.generate_config.infer_tensor_parallel_size = 1
    cfg.generate_config.infer_expert_parallel_size = iep
    cfg.generate_config.num_instances = instances
    cfg.rl_config.mode = "mindspeed-sync" if colocated else "asp"
    lay = plan_layout(cfg, nodes, per_node, A3 if per_node == 16 else card_for("910b"))
    used = [
        (node, d) for i in lay.instances for node in range(i.node, i.node + i.span_nodes) for d in i.npus
    ]
    assert len(used) == len(set(used))
    for i in lay.instances:
        assert len(i.npus) * i.span_nodes == iep
        assert i.span_nodes == 1 or i.npus == list(range(per_node))
    if not any(p.startswith(("cluster:", "placement:")) for p in lay.problems):
        assert len(lay.instances) * iep == lay.rollout_npus


def test_uneven_stages_hold_their_own_layers_and_the_largest_middle_stage_is_reported() -> None:
    a = ModelDims(**KNOWN_MODELS["deepseekv3_671b"])  # 61 layers, the first 3 dense
    cfg = _cfg("deepseekv3_671b", tensor_model_parallel_size=4, pipeline_model_parallel_size=6,
               expert_model_parallel_size=64, expert_tensor_parallel_size=1, data_parallel_size=16,
               num_layer_list=[9, 10, 10, 10, 11, 11])
    est = trainer_memory(cfg, a, A3)
    middle = max((stage_memory(cfg, a, A3, s) for s in range(1, 5)), key=lambda e: e.total_gib)
    assert [e.role for e in est] == ["trainer stage 0 (first)", middle.role, "trainer stage 5 (last)"]
    assert est[1].total_gib == middle.total_gib
    assert est[0].notes[0].startswith("9 layers (6 MoE)") and est[2].notes[0].startswith("11 layers (11 MoE)")
    # experts over EP64 x expert TP1: one rank of an 11-layer stage holds 11 x 256/64 whole experts
    expert_b = 11 * 256 * 3 * a.hidden_size * a.moe_ffn_hidden_size / 64
    assert f"{expert_b / 1e9:.2f}B expert, EP64 x expert TP1" in est[2].notes[0]


def test_context_parallel_splits_activations_and_logits() -> None:
    a = ModelDims(**KNOWN_MODELS["qwen25_7b"])
    one = trainer_memory(_cfg("qwen25_7b", data_parallel_size=2), a, A3)[0].parts
    two = trainer_memory(_cfg("qwen25_7b", data_parallel_size=1, context_parallel_size=2), a, A3)[0].parts
    assert two["activations"] == pytest.approx(one["activations"] / 2, rel=0.02)  # the same micro-batches
    assert two["logits"] == pytest.approx(one["logits"] / 2)
    assert two["weights"] == one["weights"]
