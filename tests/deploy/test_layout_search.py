"""Optimizer state on the host (sized by `check`) and the layout search (`check --suggest`,
`rl_config.layout: auto`, the importer's asynchronous split): pure arithmetic and the simulator core."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from asp_npu.cli import main as cli_main
from asp_npu.config import Config, load_config, validate
from asp_npu.deploy.arch import resolve_arch
from asp_npu.deploy.hybrid import stage_tensors
from asp_npu.deploy.layout import card_for, plan_layout
from asp_npu.deploy.memory import GIB, HOST_BYTES_PER_OFFLOADED_PARAM, optimizer_splits, trainer_memory
from asp_npu.deploy.search import Candidate, apply, balanced_stages, search

FIXTURES = Path(__file__).parent / "fixtures"
A2 = card_for("910b")


def _cfg(**act: object) -> Config:
    """Qwen2.5-7B on one A2 node, mode asp, the distributed optimizer on."""
    cfg = load_config(None, check=False)
    cfg.model.arch.model_type = "qwen2"
    for k, v in dict(hidden_size=3584, num_layers=28, num_attention_heads=28, num_key_value_heads=4,
                     vocab_size=152064, intermediate_size=18944, max_position_embeddings=32768).items():
        setattr(cfg.model.arch, k, v)
    cfg.model.dtype, cfg.model.build_if_missing = "bfloat16", True
    cfg.trainer.device, cfg.trainer.card = "npu", "910b"
    a = cfg.actor_config
    a.tensor_model_parallel_size, a.data_parallel_size, a.use_distributed_optimizer = 2, 2, True
    a.micro_batch_size = 1
    cfg.rl_config.max_prompt_length, cfg.generate_config.sampling_config.max_tokens = 512, 1536
    cfg.rl_config.mini_batch_size, cfg.rl_config.max_lag = 64, 2
    cfg.generate_config.num_instances, cfg.generate_config.infer_tensor_parallel_size = 2, 2
    cfg.generate_config.max_num_seqs, cfg.generate_config.gpu_memory_utilization = 64, 0.9
    for k, v in act.items():
        setattr(a, k, v)
    return cfg


@settings(max_examples=25, deadline=None)
@given(fraction=st.floats(0.0, 1.0), dp=st.sampled_from([1, 2, 4]))
def test_offload_moves_megatrons_share_of_the_optimizer_to_the_host(fraction: float, dp: int) -> None:
    """Whole tensors of each DP rank's shard go to the host until the fraction is reached (at most one
    tensor more: `asp_npu.deploy.hybrid`); the NPU keeps the others' moments and, bf16 weights, the
    fp32 master of every element. The worst rank is reported."""
    base = _cfg(data_parallel_size=dp)
    arch = resolve_arch(base)[0]
    assert arch is not None
    on = _cfg(data_parallel_size=dp, optimizer_cpu_offload=True, optimizer_offload_fraction=fraction)
    before, after = trainer_memory(base, arch, A2)[0], trainer_memory(on, arch, A2)[0]
    for k in ("weights", "gradients", "activations"):  # fp32 main grads stay in megatron's DDP buffer
        assert after.parts[k] == before.parts[k]
    assert before.host_gib == 0.0
    if not fraction:
        assert after.parts["optimizer"] == before.parts["optimizer"] and after.host_gib == 0.0
        return
    splits = optimizer_splits(on, arch, 0)[0]
    largest = max(t.numel for t in stage_tensors(arch, range(1), 2, 1, 2, True, True, 1)[0])  # vocab-sized
    for s in splits:
        total = s.device + s.host
        assert fraction * total <= s.host <= fraction * total + largest
    assert after.host_gib == pytest.approx(max(s.host for s in splits) * HOST_BYTES_PER_OFFLOADED_PARAM / GIB)
    assert after.parts["optimizer"] == pytest.approx(max(4 * (s.device + s.host) + 8 * s.device
                                                         for s in splits) / GIB)
    assert after.parts["optimizer"] <= before.parts["optimizer"] * (1.0 + 1e-3)


def test_host_memory_per_node_counts_every_trainer_rank_of_the_node() -> None:
    cfg = _cfg(optimizer_cpu_offload=True, optimizer_offload_fraction=1.0)
    lay = plan_layout(cfg, 1, 8, A2)
    per_rank = max(m.host_gib for m in lay.memory if m.role.startswith("trainer"))
    assert lay.trainer_npus == 4 and lay.host_gib_per_node == pytest.approx(4 * per_rank)
    assert 0 < lay.host_budget_gib < A2.host_memory_gib and not lay.problems
    cfg.trainer.host_memory_gib = 64.0  # 64 - 19.2 (Ray) - 32 (OS) < the offloaded state
    assert any(p.startswith("host memory: a node holds") for p in plan_layout(cfg, 1, 8, A2).problems)


def _write(tmp_path: Path, cfg: Config) -> Path:
    out = tmp_path / "c.yaml"
    out.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    return out


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("actor_config.use_distributed_optimizer=false",
         "actor_config.optimizer_cpu_offload: needs actor_config.use_distributed_optimizer=true"),
        ("actor_config.optimizer_offload_fraction=1.5", "actor_config.optimizer_offload_fraction"),
        ("actor_config.optimizer_offload_fraction=-0.1", "actor_config.optimizer_offload_fraction"),
        ("trainer.host_memory_gib=64", "host memory: a node holds"),
    ],
)
def test_bad_offload_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            override: str, needle: str) -> None:
    path = _write(tmp_path, _cfg(optimizer_cpu_offload=True))
    assert cli_main(["check", "--config", str(path), "--no-sim", override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    problems = [line for line in err if "problem:" in line]
    assert len(problems) == 1 and needle in problems[0], err


def test_layout_auto_with_a_fixed_layout_is_refused_in_one_line(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _cfg())
    assert cli_main(["check", "--config", str(path), "rl_config.layout=auto"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rl_config.layout: auto chooses the layout itself" in err[0]
    assert "actor_config.tensor_model_parallel_size=2" in err[0]
    bad = _cfg()
    bad.rl_config.layout = "manual"
    assert any(p.startswith("rl_config.layout: 'manual'") for p in validate(bad))


def test_balanced_stages_cover_every_layer() -> None:
    for layers in (28, 61, 94):
        for pp in (1, 3, 4, 6, 8):
            st_ = balanced_stages(layers, pp)
            assert sum(st_) == layers and max(st_) - min(st_) <= 1 and len(st_) == pp


def test_search_picks_a_fitting_split_of_best_simulated_throughput() -> None:
    cfg = _cfg()
    res = search(cfg, 1, 8, A2, top=4)
    assert res.ranked and res.fitting <= res.tried
    tput = [s.throughput_tok_s for s in res.ranked]
    assert tput == sorted(tput, reverse=True) and tput[0] > 0
    for s in res.ranked:  # every simulated split passes the check on the same 8 NPUs
        assert not plan_layout(s.cfg, 1, 8, A2).problems and not validate(s.cfg)
        assert s.lay.rollout_npus + s.lay.trainer_npus <= 8
    assert res.baseline is not None and res.baseline["mode"] == "mindspeed-sync"


def test_apply_writes_the_candidate_and_offload_turns_on_the_distributed_optimizer() -> None:
    cfg = _cfg(use_distributed_optimizer=False)
    out = apply(cfg, Candidate(instances=3, infer_tp=1, tp=1, pp=4, cp=1, dp=1, recompute="full",
                               offload=0.5))
    a, g = out.actor_config, out.generate_config
    assert (g.num_instances, g.infer_tensor_parallel_size) == (3, 1)
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.data_parallel_size) == (1, 4, 1)
    assert a.recompute_granularity == "full" and a.optimizer_cpu_offload and a.use_distributed_optimizer
    assert a.optimizer_offload_fraction == 0.5 and not a.sequence_parallel
    assert cfg.actor_config.tensor_model_parallel_size == 2  # the input is not changed


def test_layout_auto_checks_the_search_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _cfg()
    d = Config()
    cfg.actor_config.tensor_model_parallel_size = d.actor_config.tensor_model_parallel_size
    cfg.actor_config.data_parallel_size = d.actor_config.data_parallel_size
    cfg.generate_config.num_instances = d.generate_config.num_instances
    cfg.generate_config.infer_tensor_parallel_size = d.generate_config.infer_tensor_parallel_size
    cfg.rl_config.layout = "auto"
    path = _write(tmp_path, cfg)
    assert cli_main(["check", "--config", str(path), "--nodes", "1", "--npus-per-node", "8"]) == 0, (
        capsys.readouterr().err)
    out = capsys.readouterr().out
    assert "rl_config.layout: auto -> the best split above is checked below" in out
    assert "layout search:" in out and "colocated baseline" in out


def test_swap_optimizer_imports_to_host_offload_in_mode_asp(tmp_path: Path) -> None:
    ms = OmegaConf.to_container(OmegaConf.load(FIXTURES / "grpo_qwen25_7b_A3.yaml"))
    assert isinstance(ms, dict)
    ms["megatron_training"]["swap_optimizer"] = True
    src = tmp_path / "grpo_swap_A3.yaml"
    src.write_text(OmegaConf.to_yaml(OmegaConf.create(ms)))
    out = tmp_path / "o.yaml"
    assert cli_main(["import-config", "mindspeed-rl", str(src), "--out", str(out)]) == 0
    cfg = load_config(str(out), check=False)
    assert cfg.rl_config.mode == "asp" and cfg.actor_config.use_distributed_optimizer
    lay = plan_layout(copy.deepcopy(cfg), cfg.trainer.nnodes, cfg.trainer.n_devices_per_node, card_for("a3"))
    assert not lay.problems


def test_sim_layout_auto_is_never_behind_the_fixed_sweep_split() -> None:
    """`rl.layout: auto` simulates every split of the sweep point's devices, the fixed one among them."""
    from asp_npu.sim.preset import load_preset
    from asp_npu.sim.run import build_workload, simulate

    fixed = load_preset("paper", iterations=3)
    auto = load_preset("paper", iterations=3, overrides={"layout": "auto"})
    wl = build_workload(fixed)
    a, f = simulate(auto, wl, "asp", instances=2), simulate(fixed, wl, "asp", instances=2)
    assert a.layout.devices == f.layout.devices == 2 * 2 + fixed.cluster.sweep_trainer_devices
    assert a.metrics["throughput_tokens_per_s"] >= f.metrics["throughput_tokens_per_s"]
    assert len(a.metrics["split_search"]) > 1


def test_offloaded_step_charges_the_calibrated_host_figure(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """With offload the trainer's step pays the host Adam per offloaded parameter (the calibrated figure
    where one is given, else the documented NPU-host one) plus PCIe; a larger figure, a slower
    simulated iteration; without offload no host time whatever the figure."""
    import json

    from asp_npu.deploy.estimate import (
        HOST_ADAM_S_PER_PARAM,
        HOST_OPTIMIZER_S_PER_PARAM,
        PCIE_S_PER_PARAM,
        build_preset,
        estimate,
        trainer_layout_costs,
    )
    from asp_npu.deploy.memory import offloaded_params

    def run(figure: float, offload: bool) -> tuple[float, float, float]:
        cfg = _cfg(optimizer_cpu_offload=offload, optimizer_offload_fraction=1.0)
        cfg.trainer.host_optimizer_s_per_param = figure
        lay = plan_layout(cfg, 1, 8, A2)
        assert not lay.problems and lay.arch is not None
        host = trainer_layout_costs(cfg, lay)[1]
        per = offloaded_params(cfg, lay.arch)
        assert host == pytest.approx(per * ((figure or HOST_ADAM_S_PER_PARAM) + PCIE_S_PER_PARAM))
        rows = estimate(cfg, lay)[0]
        assert rows is not None
        return host, build_preset(cfg, lay).cost.train_step_s, rows[0]["iteration_s"]

    assert HOST_OPTIMIZER_S_PER_PARAM == pytest.approx(2.24e-9)
    documented, fast, slow = run(0.0, True), run(0.5e-9, True), run(20e-9, True)
    assert fast[0] < documented[0] < slow[0] and fast[1] < documented[1] < slow[1]
    assert slow[2] > fast[2]  # the simulated iteration pays it
    assert run(0.0, False)[:2] == run(20e-9, False)[:2] and run(20e-9, False)[0] == 0.0

    path, calib = _write(tmp_path, _cfg(optimizer_cpu_offload=True)), tmp_path / "calib.json"
    calib.write_text(json.dumps({"schema": "asp-calib/1", "host_optimizer_s_per_param": 7e-10}))
    assert cli_main(["check", "--config", str(path), "--no-sim", "--calib", str(calib)]) == 0
    calib.write_text(json.dumps({"schema": "asp-calib/1", "host_optimizer_s_per_param": None}))
    assert cli_main(["check", "--config", str(path), "--no-sim", "--calib", str(calib)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no host_optimizer_s_per_param" in err[0], err
