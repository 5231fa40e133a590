"""The real-engine modes: the one mode table (`asp_npu.core.modes`) plus what needs a Config."""

from __future__ import annotations

from asp_npu.config import Config
from asp_npu.core.modes import REAL_MODES, TABLE, Mode, instances_on, mode_spec

__all__ = ["REAL_MODES", "SPECS", "Mode", "instance_count", "instances_on", "mode_spec"]

SPECS: dict[str, Mode] = {m: TABLE[m] for m in REAL_MODES}


def instance_count(cfg: Config, colocated: bool, devices: int) -> int:
    """Rollout instances of a run on `devices` devices in all (CPU: cores); see `core.modes.instances_on`."""
    gen = cfg.generate_config
    return instances_on(gen.num_instances, gen.infer_tensor_parallel_size, colocated, devices)
