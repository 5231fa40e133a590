"""Bounded waits: a silent actor times out and a dead one is reported, each by name (real Ray)."""

from __future__ import annotations

import time

import pytest

from asp_npu.remote import ActorLost, ActorTimeout, get, kill_quietly

pytestmark = pytest.mark.slow


class Sleeper:
    def nap(self, s: float) -> float:
        time.sleep(s)
        return s


@pytest.fixture(scope="module")
def ray_local():
    import os

    import ray

    from asp_npu.device import loopback_env

    for k, v in loopback_env().items():
        os.environ.setdefault(k, v)
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="error")
    yield ray
    ray.shutdown()


def test_get_names_the_silent_and_the_dead_actor(ray_local):
    ray = ray_local
    a, b = (ray.remote(Sleeper).options(num_cpus=0).remote() for _ in range(2))
    assert get([a.nap.remote(0), b.nap.remote(0)], 30, ["fast", "slow"]) == [0, 0]
    with pytest.raises(ActorTimeout, match="no answer from slow \\(nap\\) within 1s") as exc:
        get([a.nap.remote(0), b.nap.remote(20)], 1, ["fast", "slow"], "nap")
    assert exc.value.who == "slow"
    ref = a.nap.remote(30)
    kill_quietly(a)
    with pytest.raises(ActorLost, match="^fast died") as lost:
        get(ref, 30, "fast")
    assert lost.value.who == "fast"
    kill_quietly(a)  # twice: never raises
    kill_quietly(b)
