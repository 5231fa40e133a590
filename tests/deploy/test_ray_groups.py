"""The layout's Ray placement groups: one STRICT_PACK group per rollout instance and per trainer TP group,
bound to the node the layout gives it, one bundle per device -- the same placement `asp-npu check` prints."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.config import load_config
from asp_npu.core.shape import RunShape
from asp_npu.deploy.layout import card_for, place, plan_layout, ray_groups
from asp_npu.errors import UserError

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "npu"
_BASE = load_config(str(CONFIGS / "qwen25_7b_a2_2node.yaml"), check=False)


@given(nodes=st.integers(1, 3), itp=st.sampled_from([1, 2, 4]), instances=st.integers(1, 6),
       tp=st.sampled_from([1, 2, 4]), dp=st.integers(1, 3))
@settings(max_examples=60, deadline=None)
def test_groups_follow_the_printed_layout(nodes: int, itp: int, instances: int, tp: int, dp: int) -> None:
    cfg = copy.deepcopy(_BASE)
    cfg.generate_config.infer_tensor_parallel_size, cfg.generate_config.num_instances = itp, instances
    act = cfg.actor_config
    act.tensor_model_parallel_size, act.pipeline_model_parallel_size, act.data_parallel_size = tp, 1, dp
    lay = place(cfg, nodes, 8)
    printed = plan_layout(cfg, nodes, 8, card_for("910b"))  # what `asp-npu check` prints
    assert [(i.node, i.npus) for i in lay.instances] == [(i.node, i.npus) for i in printed.instances]
    assert [(g.node, g.npus) for g in lay.trainer] == [(g.node, g.npus) for g in printed.trainer]
    inst, trainer = ray_groups(lay, "NPU")
    assert [(g.node, len(g.bundles), g.strategy) for g in inst] == \
        [(i.node, len(i.npus), "STRICT_PACK") for i in lay.instances]
    assert [(g.node, len(g.bundles)) for g in trainer] == [(t.node, len(t.ranks)) for t in lay.trainer]
    assert all(b == {"CPU": 1.0, "NPU": 1.0} for g in inst + trainer for b in g.bundles)
    # per node, the groups reserve no more devices than the layout hands out there
    for n in range(nodes):
        used = sum(len(g.bundles) for g in inst + trainer if g.node == n)
        assert used <= 8


def test_cpu_groups_hold_cores_and_an_instance_group_that_spans_nodes_is_unbound() -> None:
    cfg = copy.deepcopy(_BASE)
    cfg.generate_config.num_instances, cfg.generate_config.infer_tensor_parallel_size = 2, 1
    inst, trainer = ray_groups(place(cfg, 2, 8), None)
    assert all(b == {"CPU": 1.0} for g in inst + trainer for b in g.bundles)
    cfg.generate_config.infer_expert_parallel_size, cfg.generate_config.num_instances = 16, 1
    lay = place(cfg, 3, 8)
    if lay.instances and lay.instances[0].span_nodes > 1:
        g = ray_groups(lay, "NPU")[0][0]
        assert g.node == -1 and g.strategy == "PACK" and len(g.bundles) == 16


def test_a_run_that_does_not_fit_its_nodes_is_refused_in_one_line(tmp_path) -> None:
    from asp_npu.core.modes import mode_spec
    from asp_npu.pipeline.placement import ClusterPlacement

    cfg = copy.deepcopy(_BASE)
    cfg.generate_config.num_instances = 40
    with pytest.raises(UserError, match="placement|cluster"):
        ClusterPlacement(cfg, "npu", RunShape.from_config(cfg, 16, mode_spec("asp", "unit")), 8)
