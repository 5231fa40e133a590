"""What a trainer rank starts from beyond the config it reads: the policy weights and (CPU) its cores.

The loaded config stays as the user wrote it; start-up derives the rest (the warm-started or converted
policy, the placement's cores and threads: `pipeline/derived.py`) and hands it to the ranks as a
`RankStart`. Without one a rank starts from what the config alone says (`RankStart.of`).
"""

from __future__ import annotations

from dataclasses import dataclass

from asp_npu.config import Config


@dataclass(frozen=True)
class RankStart:
    policy_path: str  # HF folder the ranks build the model from (config, tokenizer, weights)
    megatron: str = ""  # Megatron weights loaded instead of the folder's (`model.load_megatron`)
    cores: tuple[int, ...] = ()  # CPU cores the ranks are pinned to, split over them (() = not pinned)
    threads: int = 0  # torch threads per rank (0 = its cores, else the machine's cores / ranks)

    @classmethod
    def of(cls, cfg: Config) -> RankStart:
        """The start `cfg` alone gives (nothing derived): `model.path`, `model.load_megatron`,
        `actor_config.cpu_cores` and `num_threads`."""
        act = cfg.actor_config
        return cls(cfg.model.path, cfg.model.load_megatron, tuple(act.pinned_cores()), act.num_threads)
