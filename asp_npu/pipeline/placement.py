"""The layout on the Ray cluster: one placement group per rollout instance and per trainer TP group.

`asp-npu check` prints the layout (`deploy.layout.place`): which node and devices each instance and
trainer group gets. Here each group of that layout becomes a Ray placement group (STRICT_PACK, one
bundle per device, as MindSpeed-RL and verl reserve an engine's devices) bound to its node through
Ray's node-id label; layout node 0 is the driver's node when it offers devices, the others follow in
node-id order. An instance actor sits in bundle 0 of its group (the other bundles hold the rest of
its devices); trainer rank r sits in bundle r mod TP of its TP group's placement group.

A node that dies takes its instances with it: the fleet loses them like any dead instance
(`pipeline.recovery`), and `rehome` gives a replacement a fresh group on any node with room.
"""

from __future__ import annotations

from typing import Any

from asp_npu.config import Config
from asp_npu.core.shape import RunShape
from asp_npu.errors import UserError

READY_S = 120.0  # every placement group must be placed within this (else: the cluster lacks room)


class ClusterPlacement:
    def __init__(self, cfg: Config, kind: str, shape: RunShape, per_node: int) -> None:
        """The layout of `cfg` on `trainer.nnodes` x `per_node` devices (no Ray needed yet)."""
        from asp_npu.deploy.layout import place, ray_groups
        from asp_npu.device import spec

        self.nnodes = max(1, cfg.trainer.nnodes)
        lay = place(cfg, self.nnodes, per_node)
        if lay.problems:
            raise UserError(lay.problems[0])
        if len(lay.instances) != shape.instances:
            raise UserError(f"placement: the layout places {len(lay.instances)} rollout instances, the "
                            f"run has {shape.instances} (trainer.nnodes={self.nnodes}, {per_node} devices "
                            "per node)")
        self.layout = lay
        self.instance_groups, self.trainer_groups = ray_groups(lay, spec(kind).ray_resource)  # type: ignore[arg-type]
        self.resource = spec(kind).ray_resource  # type: ignore[arg-type]
        self.node_ids: list[str] = []  # Ray node id of each layout node
        self.instance_pgs: list[Any] = []
        self.trainer_pgs: list[Any] = []

    def create(self) -> None:
        """Bind the layout's nodes to the cluster's and place every group (bounded wait)."""
        import ray

        self.node_ids = cluster_nodes(self.nnodes, self.resource)
        self.instance_pgs = [self._make(g.bundles, g.strategy, g.node) for g in self.instance_groups]
        self.trainer_pgs = [self._make(g.bundles, g.strategy, g.node) for g in self.trainer_groups]
        groups = list(zip(self.instance_groups + self.trainer_groups, self.instance_pgs + self.trainer_pgs,
                          strict=True))
        refs = [pg.ready() for _, pg in groups]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=READY_S)
        if len(ready) < len(refs):
            missing = [g.name for (g, _), ref in zip(groups, refs, strict=True) if ref not in ready]
            self.remove()
            raise UserError(f"placement: {', '.join(missing[:4])} not placed within {READY_S:.0f}s; the Ray "
                            f"cluster lacks the devices the layout needs ({ray.available_resources()})")

    def _make(self, bundles: tuple[dict[str, float], ...], strategy: str, node: int) -> Any:
        from ray.util.placement_group import NODE_ID_LABEL_KEY, placement_group

        select = [{NODE_ID_LABEL_KEY: self.node_ids[node]} for _ in bundles] if node >= 0 else None
        return placement_group([dict(b) for b in bundles], strategy=strategy, bundle_label_selector=select)

    def node_of(self, i: int) -> str:
        """Ray node id of instance i's layout node ("" for a group bound to no node)."""
        node = self.instance_groups[i].node
        return self.node_ids[node] if node >= 0 else ""

    def instance_options(self, i: int, options: dict[str, Any]) -> dict[str, Any]:
        """`options` (from `rollout.instance.instance_placement`) moved into bundle 0 of instance i's
        group: one CPU there; the group's bundles hold its devices."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        out = {k: v for k, v in options.items() if k != "resources"}
        out["num_cpus"] = 1
        out["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            self.instance_pgs[i], placement_group_bundle_index=0, placement_group_capture_child_tasks=True)
        return out

    def trainer_options(self, rank: int) -> dict[str, Any]:
        """Scheduling of trainer rank `rank` (Megatron order: TP fastest) in its TP group's bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        tp = len(self.trainer_groups[0].bundles)
        return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
            self.trainer_pgs[rank // tp], placement_group_bundle_index=rank % tp)}

    def rehome(self, i: int) -> None:
        """Instance i's node is gone: a fresh group of the same shape on any node with room (its
        replacement actor waits for it; `Fleet.started` bounds that wait)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        node = self.node_of(i)
        if not node or any(n["NodeID"] == node and n["Alive"] for n in ray.nodes()):
            return
        remove_placement_group(self.instance_pgs[i])
        g = self.instance_groups[i]
        self.instance_pgs[i] = self._make(g.bundles, g.strategy, -1)

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in self.instance_pgs + self.trainer_pgs:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - best effort at shutdown (Ray may be going down already)
                pass
        self.instance_pgs, self.trainer_pgs = [], []


def cluster_nodes(n: int, resource: str | None) -> list[str]:
    """Ray node ids for layout nodes 0..n-1: live nodes offering devices, the driver's node first."""
    import ray

    key = resource or "CPU"
    here = ray.get_runtime_context().get_node_id()
    live = [x["NodeID"] for x in ray.nodes() if x["Alive"] and x["Resources"].get(key, 0) > 0]
    live.sort(key=lambda node: (node != here, node))
    if len(live) < n:
        raise UserError(f"trainer.nnodes: {n} nodes, but the Ray cluster has {len(live)} live node(s) with "
                        f"{key} resources")
    return live[:n]
