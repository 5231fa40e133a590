"""Instance recovery on the transfer-engine path: the driver's side of re-forming the weight group.

Ray actors stand in for trainer rank 0 (it answers a push the way `push_from_trainer` does, and fails it
naming the instance when a member of the link is dead) and for the rollout instances; the real
transfer over real engines is covered in tests/weights/test_engine_link.py and by the chaos test.
Checked here: a lost instance leaves the group and the survivors keep refreshing over a new one (new
key, only live members), its replacement re-enters it and receives the published version, a push that
breaks on a dead member hands that member to recovery and is repeated over the survivors at once, and a
dead trainer is one line.
"""

from __future__ import annotations

import time

import pytest

from asp_npu.remote import ActorLost
from asp_npu.weights.engine_link import WeightSyncError
from asp_npu.weights.refresh import TransferEngineWeights

pytestmark = pytest.mark.slow


class Rank0:
    """Trainer rank 0 as the driver sees it: `call("push_weights_to_rollout", link, send)`. Like the real
    one it sends its own version (its step count when the push runs) and refuses to send a version twice
    over the same group (`CollectiveTransport.send`)."""

    def __init__(self) -> None:
        self.links: list[tuple[str, tuple[int, ...]]] = []
        self.version = 0
        self.sent: dict[str, int] = {}  # link key -> last version sent over it

    def step(self) -> None:
        self.version += 1

    def call(self, method: str, link, send: bool = True) -> dict:
        import ray

        from asp_npu.weights.engine_link import WeightSyncError

        assert method == "push_weights_to_rollout"
        formed = not self.links or self.links[-1][0] != link.key
        if formed:
            self.links.append((link.key, link.ids))
        for k, inst in enumerate(link.instances):
            try:
                ray.get(inst.ping.remote(), timeout=10)
            except ray.exceptions.RayActorError:
                raise WeightSyncError(f"weight_refresh: rollout instance {link.ids[k] if link.ids else k} "
                                      "(weight-group rank 1) died during start_weight_update") from None
        if send:
            last = self.sent.get(link.key)
            if last is not None and self.version <= last:
                raise WeightSyncError(f"weight_refresh: received version {self.version} after version "
                                      f"{last}; versions must increase")
            self.sent[link.key] = self.version
        reports = [{"instance": i, "version": self.version, "total_s": 0.01, "drain_s": 0.0}
                   for i in link.ids or range(len(link.instances))]
        return {"connect_s": 0.001 if formed else 0.0, "formed": formed, "send_s": 0.0,
                "instances": reports if send else []}

    def seen(self) -> list[tuple[str, tuple[int, ...]]]:
        return list(self.links)


class Instance:
    def ping(self) -> int:
        return 0

    def transfer_world_size(self) -> int:
        return 1


class Trainer:
    """`TrainerGroup`'s face: `actors` and `push_weights_to_rollout`."""

    def __init__(self, actor) -> None:
        self.actors = [actor]

    def push_weights_to_rollout(self, link, send: bool = True) -> dict:
        import ray

        return ray.get(self.actors[0].call.remote("push_weights_to_rollout", link, send), timeout=60)


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="error")
    yield ray
    ray.shutdown()


def _publish(ray, rank0, w: TransferEngineWeights, version: int) -> None:
    """The controller after a trainer step: the trainer holds `version`; publish it and refresh."""
    ray.get(rank0.step.remote())
    w.publish(w.gather(), version)
    w.refresh()


def _settle(w: TransferEngineWeights, timeout: float = 60.0) -> list:
    """Poll until no push is in flight; every Refreshed seen."""
    out, deadline = [], time.monotonic() + timeout
    while w.pending():
        assert time.monotonic() < deadline, "push never finished"
        out += w.poll()
        time.sleep(0.01)
    return out + w.poll()


def test_a_lost_instance_leaves_the_group_and_its_replacement_rejoins(ray_local):
    ray = ray_local
    rank0 = ray.remote(Rank0).remote()
    instances = [ray.remote(Instance).remote() for _ in range(3)]
    w = TransferEngineWeights(Trainer(rank0), instances, drain=False, timeout_s=30)
    (first,) = ray.get(rank0.seen.remote())
    assert first[1] == ()  # the group formed at start: every instance, numbered by position

    _publish(ray, rank0, w, 1)
    assert {r.instance for r in _settle(w)} == {0, 1, 2} and w.held == [1, 1, 1]

    ray.kill(instances[1], no_restart=True)
    w.lost(1)
    _publish(ray, rank0, w, 2)
    assert {r.instance for r in _settle(w)} == {0, 2} and w.held == [2, 1, 2]
    key, ids = ray.get(rank0.seen.remote())[-1]
    assert ids == (0, 2) and key != first[0]  # a new group over the survivors

    instances[1] = ray.remote(Instance).remote()  # the fleet replaces the actor in place
    w.replaced(1)
    w.refresh()
    assert [(r.instance, r.version) for r in _settle(w)] == [(0, 2), (1, 2), (2, 2)] and w.held == [2, 2, 2]
    assert ray.get(rank0.seen.remote())[-1][1] == (0, 1, 2)
    assert [g["members"] for g in w.describe()["regroups"]] == [[0, 2], [0, 1, 2]]

    _publish(ray, rank0, w, 3)
    _settle(w)
    assert len(ray.get(rank0.seen.remote())) == 3  # membership unchanged: the group is reused


def test_a_push_broken_by_a_dead_member_goes_to_recovery_and_is_repeated(ray_local):
    ray = ray_local
    rank0 = ray.remote(Rank0).remote()
    instances = [ray.remote(Instance).remote() for _ in range(2)]
    w = TransferEngineWeights(Trainer(rank0), instances, drain=False, timeout_s=30)
    ray.kill(instances[0], no_restart=True)  # dies before the fleet's health check noticed
    _publish(ray, rank0, w, 1)
    deadline = time.monotonic() + 60
    with pytest.raises(ActorLost) as lost:
        while time.monotonic() < deadline:
            w.poll()
            time.sleep(0.01)
    assert lost.value.who == "rollout instance 0" and "\n" not in str(lost.value)
    w.lost(0)  # what recovery does with it: the survivor gets the weights over a new group at once
    assert w.pending()
    assert [(r.instance, r.version) for r in _settle(w)] == [(1, 1)] and w.held == [0, 1]
    assert ray.get(rank0.seen.remote())[-1][1] == (1,)


def test_a_push_broken_by_a_member_already_replaced_is_not_fatal(ray_local):
    """The chaos test's other race (seen once in the whole suite): the fleet's health check finds the
    member dead while the push runs, and its replacement is already in the slot (alive, not yet
    `replaced`) when the broken push is polled. The loss explains the failure: no error, and the survivor
    gets the weights over a new group at once."""
    ray = ray_local
    rank0 = ray.remote(Rank0).remote()
    instances = [ray.remote(Instance).remote() for _ in range(2)]
    w = TransferEngineWeights(Trainer(rank0), instances, drain=False, timeout_s=30)
    ray.kill(instances[0], no_restart=True)
    _publish(ray, rank0, w, 1)  # the push is in flight over the dead member
    w.lost(0)  # recovery saw it first
    instances[0] = ray.remote(Instance).remote()  # and the fleet put the replacement in its slot
    assert [(r.instance, r.version) for r in _settle(w)] == [(1, 1)] and w.held == [0, 1]
    assert ray.get(rank0.seen.remote())[-1][1] == (1,)


def test_a_dead_trainer_is_one_line(ray_local):
    ray = ray_local
    rank0 = ray.remote(Rank0).remote()
    instances = [ray.remote(Instance).remote()]
    w = TransferEngineWeights(Trainer(rank0), instances, drain=False, timeout_s=30)
    ray.kill(rank0, no_restart=True)
    w.publish(w.gather(), 1)
    w.refresh()
    deadline = time.monotonic() + 60
    with pytest.raises(WeightSyncError) as err:
        while time.monotonic() < deadline:
            w.poll()
            time.sleep(0.01)
    assert "\n" not in str(err.value) and "the trainer (weight-group rank 0) is gone" in str(err.value)


def test_a_push_that_runs_after_the_next_step_records_the_version_it_sent(ray_local):
    """The chaos test's race: a push breaks on a dead member, and its repeat over the survivor reaches the
    trainer after its next step, so it sends that step's weights. The survivor is recorded at the version
    it got, and publishing that version starts no second push of it (the real sender refuses one version
    twice over one group: "received version 2 after version 2")."""
    ray = ray_local
    rank0 = ray.remote(Rank0).remote()
    instances = [ray.remote(Instance).remote() for _ in range(2)]
    w = TransferEngineWeights(Trainer(rank0), instances, drain=False, timeout_s=30)
    ray.kill(instances[0], no_restart=True)
    _publish(ray, rank0, w, 1)
    deadline = time.monotonic() + 60
    with pytest.raises(ActorLost):
        while time.monotonic() < deadline:
            w.poll()
            time.sleep(0.01)
    ray.get(rank0.step.remote())  # the controller's next step runs before the repeated push
    w.lost(0)
    assert [(r.instance, r.version) for r in _settle(w)] == [(1, 2)] and w.held == [0, 2]
    w.publish(w.gather(), 2)  # the controller publishes step 2 once it returns
    w.refresh()
    assert not w.pending() and _settle(w) == []
    _publish(ray, rank0, w, 3)
    assert [(r.instance, r.version) for r in _settle(w)] == [(1, 3)] and w.held == [0, 3]
