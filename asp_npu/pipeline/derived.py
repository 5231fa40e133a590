"""What a run derives at start, kept apart from the config the user loaded (which never changes).

The loaded `Config` is frozen and stays as loaded for the whole run (`config.yaml` in the run
directory). What start-up works out from it lives here, in one frozen `RunDerived`: the policy the
instances and the trainer start from (`model.path`, or the Megatron weights converted to an HF folder,
or the SFT warm-started policy), the checkpoint the run resumes from (`actor_config.load`, or after a
trainer failure the last complete checkpoint), and on CPU the cores and torch threads of the trainer
ranks (`actor_config.cpu_cores` / `num_threads`, or the placement's). Each start of the pipeline
writes it to `derived.yaml` beside `config.yaml`, and hands the trainer ranks their part (`RankStart`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from asp_npu.config import Config
from asp_npu.trainer.start import RankStart

MODEL_PATH, CONVERTED, WARM_STARTED = "model.path", "model.load_megatron", "warm_start"


@dataclass(frozen=True)
class RunDerived:
    policy_path: str  # HF folder of the policy the instances and the trainer start from
    policy_from: str  # MODEL_PATH | CONVERTED (Megatron weights -> HF folder) | WARM_STARTED (SFT)
    megatron: str  # Megatron weights the trainer loads over `policy_path` ("" = none or converted)
    resume_from: str  # checkpoint the run (or its restart) resumes from ("" = the beginning)
    trainer_cores: tuple[int, ...] = ()  # CPU: cores the trainer ranks are pinned to (() = not pinned)
    trainer_threads: int = 0  # torch threads per trainer rank (0 = automatic)

    @classmethod
    def at_start(cls, cfg: Config) -> RunDerived:
        """Before anything is derived: what the loaded config says."""
        rank = RankStart.of(cfg)  # the one reader of the config's policy, cores and threads
        return cls(rank.policy_path, MODEL_PATH, rank.megatron, cfg.actor_config.load, rank.cores,
                   rank.threads)

    def with_policy(self, path: str, source: str) -> RunDerived:
        """The policy now starts from the HF folder `path` (its weights, no Megatron load over them)."""
        return replace(self, policy_path=str(path), policy_from=source, megatron="")

    def placed(self, cores: tuple[int, ...], threads: int) -> RunDerived:
        return replace(self, trainer_cores=tuple(cores), trainer_threads=threads)

    def restarted(self, checkpoint: str) -> RunDerived:
        return replace(self, resume_from=checkpoint)

    def rank_start(self) -> RankStart:
        """The trainer ranks' part (and the critic's, colocated on the same cores)."""
        return RankStart(self.policy_path, self.megatron, self.trainer_cores, self.trainer_threads)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["trainer_cores"] = list(self.trainer_cores)
        return d

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)
