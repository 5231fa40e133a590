"""`asp-npu check`: shipped NPU configs fit their clusters and are refused, with clear messages, on
smaller ones; every problem of a bad config is listed; placement and memory maths hold."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.cli import main as cli_main
from asp_npu.config import load_config
from asp_npu.deploy.layout import card_for, plan_layout, resolve_arch, trainer_memory
from asp_npu.pipeline.modes import instance_count

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "npu"
_BASE = load_config(str(CONFIGS / "qwen25_7b_a2_1node.yaml"), check=False)
SHIPPED = {  # file -> (nodes, npus per node) it is written for
    "qwen25_7b_a2_1node.yaml": (1, 8),
    "qwen25_7b_a2_2node.yaml": (2, 8),
    "qwen25_32b_a3_4node.yaml": (4, 16),
}


def run_check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = cli_main(["check", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_every_shipped_config_is_tested() -> None:
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(SHIPPED)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_config_fits_its_cluster(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, per_node = SHIPPED[name]
    rc, out, err = run_check(
        capsys,
        "--config",
        str(CONFIGS / name),
        "--nodes",
        str(nodes),
        "--npus-per-node",
        str(per_node),
        "--no-sim",
    )
    assert rc == 0, err
    assert f"fits {nodes} node(s) x {per_node} NPUs" in out
    assert "rollout" in out and "trainer" in out and "memory per NPU" in out
    cfg = load_config(str(CONFIGS / name), check=False)
    lay = plan_layout(cfg, nodes, per_node, card_for(cfg.trainer.card))
    used = [(i.node, d) for i in lay.instances for d in i.npus] + [
        (g.node, d) for g in lay.trainer for d in g.npus
    ]
    assert len(used) == len(set(used)) == nodes * per_node  # disaggregated: every NPU has exactly one role
    assert all(m.total_gib <= m.budget_gib + 1e-6 for m in lay.memory)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_config_refused_on_a_smaller_cluster(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, per_node = SHIPPED[name]
    smaller = (
        ["--nodes", str(nodes - 1), "--npus-per-node", str(per_node)]
        if nodes > 1
        else ["--nodes", "1", "--npus-per-node", str(per_node // 2)]
    )
    rc, _, err = run_check(capsys, "--config", str(CONFIGS / name), *smaller, "--no-sim")
    assert rc == 2
    assert "problem: cluster: the config needs" in err
    assert f"needs {nodes * per_node} NPUs" in err
    assert err.strip().splitlines()[-1].startswith("asp-npu check: error: 1 problem(s)")


def test_bad_config_lists_every_problem(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_check(
        capsys,
        "--config",
        str(CONFIGS / "qwen25_32b_a3_4node.yaml"),
        "--no-sim",
        "actor_config.tensor_model_parallel_size=3",
        "actor_config.pipeline_model_parallel_size=3",
        "rl_config.max_lag=0",
        "rl_config.mini_batch_size=16",
        "generate_config.infer_tensor_parallel_size=16",
        "rl_config.mode=warp",
    )
    assert rc == 2
    problems = [line for line in err.splitlines() if line.startswith("asp-npu check: problem:")]
    for needle in (
        "rl_config.mode",
        "TP3 does not divide num_attention_heads 40",
        "PP3 does not divide num_layers 64",
        "rl_config.max_lag",
        "TP16 does not divide num_attention_heads",
        "cluster: the config needs",
    ):
        assert any(needle in p for p in problems), needle
    assert f"{len(problems)} problem(s)" in err


def test_memory_problem_names_the_role_and_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_check(
        capsys,
        "--config",
        str(CONFIGS / "qwen25_32b_a3_4node.yaml"),
        "--no-sim",
        "actor_config.tensor_model_parallel_size=2",
        "actor_config.data_parallel_size=8",
        "actor_config.use_distributed_optimizer=false",
        "generate_config.infer_tensor_parallel_size=1",
        "generate_config.num_instances=32",
    )
    assert rc == 2
    assert "memory: trainer stage 0 (first) needs" in err and "raise TP/PP" in err
    assert "memory: a rollout instance (infer TP1)" in err and "less than one sequence" in err


def test_json_output_and_unknown_card(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_check(capsys, "--config", str(CONFIGS / "qwen25_7b_a2_1node.yaml"), "--json", "--no-sim")
    assert rc == 0
    d = json.loads(out)
    assert [i["npus"] for i in d["instances"]] == [[0], [1], [2], [3]]
    assert d["trainer"][0]["npus"] == [4, 5, 6, 7] and d["problems"] == []
    rc, _, err = run_check(capsys, "--config", str(CONFIGS / "qwen25_7b_a2_1node.yaml"), "--card", "h100")
    assert rc == 2 and "unknown card 'h100'" in err


def test_arch_from_config_json_and_missing_arch(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 3584,
                "num_hidden_layers": 28,
                "num_attention_heads": 28,
                "num_key_value_heads": 4,
                "vocab_size": 152064,
                "intermediate_size": 18944,
                "max_position_embeddings": 32768,
                "tie_word_embeddings": False,
            }
        )
    )
    cfg = load_config(None, [f"model.path={model}"], check=False)
    arch, problems, source = resolve_arch(cfg)
    assert problems == [] and arch is not None and source.endswith("config.json")
    assert 7.6e9 < arch.params < 7.65e9  # Qwen2.5-7B: 7.62B parameters
    cfg = load_config(None, [f"model.path={tmp_path / 'absent'}"], check=False)
    arch, problems, _ = resolve_arch(cfg)
    assert arch is None and "model.arch.hidden_size" in problems[0]


def test_memory_falls_with_tp_and_distributed_optimizer() -> None:
    cfg = load_config(str(CONFIGS / "qwen25_7b_a2_2node.yaml"), check=False)
    arch, _, _ = resolve_arch(cfg)
    card = card_for("910b")
    base = trainer_memory(cfg, arch, card)[0]
    cfg.actor_config.use_distributed_optimizer = False
    no_dist = trainer_memory(cfg, arch, card)[0]
    assert no_dist.parts["optimizer"] == pytest.approx(2 * base.parts["optimizer"])  # DP2 shards it
    cfg.actor_config.tensor_model_parallel_size = 8
    assert trainer_memory(cfg, arch, card)[0].parts["weights"] == pytest.approx(no_dist.parts["weights"] / 2)


@given(
    nodes=st.integers(1, 4),
    per_node=st.sampled_from([4, 8, 16]),
    itp=st.sampled_from([1, 2, 4, 8]),
    instances=st.integers(1, 12),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.integers(1, 3),
    dp=st.integers(1, 4),
    colocated=st.booleans(),
)
@settings(max_examples=80, deadline=None)
def test_placement_never_splits_a_tp_group_or_reuses_an_npu(
    nodes: int, per_node: int, itp: int, instances: int, tp: int, pp: int, dp: int, colocated: bool
) -> None:
    cfg = copy.deepcopy(_BASE)
    cfg.generate_config.infer_tensor_parallel_size, cfg.generate_config.num_instances = itp, instances
    act = cfg.actor_config
    act.tensor_model_parallel_size, act.pipeline_model_parallel_size, act.data_parallel_size = tp, pp, dp
    cfg.rl_config.mode = "mindspeed-sync" if colocated else "asp"
    lay = plan_layout(cfg, nodes, per_node, card_for("a3"))
    groups = [(i.node, i.npus) for i in lay.instances] + [(g.node, g.npus) for g in lay.trainer]
    for node, npus in groups:
        assert 0 <= node < nodes and all(0 <= d < per_node for d in npus)
    # a colocated mode generates on every NPU (one instance per infer TP group), as MindSpeed-RL does
    placed_all = len(lay.instances) == instance_count(cfg, colocated, nodes * per_node) and \
        len(lay.trainer) == dp * pp
    if not any(p.startswith(("cluster:", "placement:")) for p in lay.problems):
        assert placed_all
    roles = [
        [(i.node, d) for i in lay.instances for d in i.npus],
        [(g.node, d) for g in lay.trainer for d in g.npus],
    ]
    if colocated:
        assert all(len(r) == len(set(r)) for r in roles)
    else:
        flat = roles[0] + roles[1]
        assert len(flat) == len(set(flat))
    assert [r for g in lay.trainer for r in g.ranks] == list(range(len(lay.trainer) * tp))


def test_check_prints_the_simulator_estimate_for_asp_and_mindspeed_sync(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out, err = run_check(capsys, "--config", str(CONFIGS / "qwen25_7b_a2_1node.yaml"))
    assert rc == 0, err
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.startswith(("asp ", "mindspeed-sync ")) and ":" not in line
    }
    assert set(rows) == {"asp", "mindspeed-sync"}
    for cols in rows.values():
        assert float(cols[1]) > 0 and float(cols[2].replace(",", "")) > 0  # iteration s, tokens/s
    assert "4 x TP1 + trainer 4 NPUs" in out and "8 x TP1 colocated on 8 NPUs" in out
    assert "asp / mindspeed-sync throughput:" in out


def test_check_takes_the_cards_npus_per_node_for_zero_and_refuses_no_nodes() -> None:
    from asp_npu.deploy.check import check
    from asp_npu.errors import UserError

    cfg = load_config(str(CONFIGS / "qwen25_7b_a2_1node.yaml"), check=False)
    assert check(cfg, 1, 0, "910b").npus_per_node == card_for("910b").npus_per_node
    with pytest.raises(UserError, match="a cluster needs >= 1 node"):
        check(cfg, 0, 8, "910b")
