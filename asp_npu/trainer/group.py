"""The trainer as a Ray actor group: one actor per megatron rank, driven as a single object.

The layout is validated on the driver from the HF `config.json` before any actor starts. Rank 0
picks the rendezvous address (its node's IP; 127.0.0.1 in single-machine mode, where
`device.init_ray` puts `device.loopback_env()` in force) and a free port; all ranks then initialise
the process group together (on loopback through a file, so no store listens on the network). Every
call fans out to all ranks (they are SPMD) and returns rank 0's answer.
"""

from __future__ import annotations

from typing import Any

from asp_npu.arch import ModelDims
from asp_npu.config import Config
from asp_npu.core.layout import actor_layout
from asp_npu.remote import CALL_S, get, kill_quietly
from asp_npu.trainer.features import check_features
from asp_npu.trainer.parallel import rendezvous_file
from asp_npu.trainer.start import RankStart
from asp_npu.types import TrainBatch
from asp_npu.weights.hf import HFWeights


class TrainerRank:
    """Ray actor body: holds one TrainerWorker."""

    def __init__(self) -> None:
        self.worker: Any = None

    def rendezvous(self) -> tuple[str, int]:
        import ray

        from asp_npu.net import free_port

        ip = ray.util.get_node_ip_address()
        port = free_port(ip)
        rendezvous_file(ip, port, fresh=True)  # a loopback group meets in a file (parallel.init_parallel)
        return ip, port

    def init(self, cfg: Config, start: RankStart, rank: int, world_size: int, addr: str, port: int,
             local_rank: int, role: str = "policy") -> None:
        if role == "critic":
            from asp_npu.trainer.critic import CriticWorker

            self.worker = CriticWorker(cfg, rank, world_size, addr, port, local_rank, start)
            return
        from asp_npu.trainer.worker import TrainerWorker

        self.worker = TrainerWorker(cfg, rank, world_size, addr, port, local_rank, start)

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.worker, method)(*args)


class TrainerGroup:
    """`world_size` trainer ranks as Ray actors; `train_step`, `get_hf_weights`, `save`, `load`."""

    def __init__(self, cfg: Config, world_size: int | None = None,
                 cpus_per_rank: float | None = None, placement: Any = None, role: str = "policy",
                 start: RankStart | None = None) -> None:
        """`cpus_per_rank` overrides the Ray CPU reservation (e.g. 0 when rollout engines hold the cores);
        `placement(rank, options)` gives rank's actor options (its placement-group bundle, its log file);
        `role` "critic": PPO's value model (`trainer.critic`) in the layout of `critic_config`; `start`:
        the policy and cores start-up derived for the ranks (None: what `cfg` alone says)."""
        import ray

        from asp_npu import device

        if role == "critic":
            from asp_npu.config import critic_view

            cfg = critic_view(cfg)

        start = start or RankStart.of(cfg)
        act = cfg.actor_config
        tp, pp, dp = act.tensor_model_parallel_size, act.pipeline_model_parallel_size, act.data_parallel_size
        self.world_size = world_size or tp * pp * act.context_parallel_size * dp
        dims = ModelDims.from_hf_dir(start.policy_path)
        self.layout = actor_layout(dims, act, self.world_size)  # before any actor exists
        check_features(dims, act)
        kind = device.detect(cfg.trainer.device)
        self._owns_ray = device.init_ray(max(self.world_size, device.available_devices("cpu")),
                                         cfg.trainer.nnodes <= 1, cfg.trainer.ray_address, log_to_driver=True)
        opts = device.trainer_actor_options(kind)
        if cpus_per_rank is not None:
            opts["num_cpus"] = cpus_per_rank
        actor_cls = ray.remote(TrainerRank)
        self.actors = [actor_cls.options(**(placement(r, dict(opts)) if placement else opts)).remote()
                       for r in range(self.world_size)]
        who = "critic" if role == "critic" else "trainer"
        self.names = [f"{who} rank {r}" for r in range(self.world_size)]
        self.timeout_s = cfg.trainer.stall_timeout_s  # a step, save or start-up slower than this: a hang
        addr, port = get(self.actors[0].rendezvous.remote(), CALL_S, self.names[0], "rendezvous")
        self._rendezvous = rendezvous_file(addr, port)  # removed at shutdown (single machine)
        get([a.init.remote(cfg, start, r, self.world_size, addr, port, 0, role)
             for r, a in enumerate(self.actors)], self.timeout_s, self.names, "start-up")
        self.version = 0

    def _all(self, method: str, *args: Any, timeout: float | None = None) -> list[Any]:
        return get([a.call.remote(method, *args) for a in self.actors], timeout or self.timeout_s, self.names,
                   method)

    def call(self, method: str, *args: Any) -> Any:
        """Rank 0's answer of a worker method every rank runs (e.g. the critic's `values`)."""
        return self._all(method, *args)[0]

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        import ray

        metrics = self._all("train_step", ray.put(batch))[0]
        self.version = int(metrics["policy_version"])
        return metrics

    def sft_step(self, batch: TrainBatch, lr: float | None = None) -> dict[str, float]:
        import ray

        metrics = self._all("sft_step", ray.put(batch), lr)[0]
        self.version = int(metrics["policy_version"])
        return metrics

    def set_lr(self, lr: float) -> None:
        self._all("set_lr", lr)

    def compute_logprobs(self, batch: TrainBatch) -> list[list[float]]:
        return self._all("compute_logprobs", batch)[0]

    def get_hf_weights(self) -> HFWeights:
        """Full HF-named weights of the current policy version (merged from the pipeline stages)."""
        parts = [p for p in self._all("get_hf_weights") if p is not None]
        merged = HFWeights(parts[0].version)
        for p in parts:
            merged.tensors.update(p.tensors)
        return merged

    def allocated_bytes(self) -> list[dict[str, int]]:
        """Per rank: device bytes of weights, grads and optimizer state (`trainer.memory`)."""
        return self._all("allocated_bytes")

    def push_weights_to_rollout(self, link: Any, send: bool = True) -> dict[str, Any]:
        """Trainer rank 0 pushes its weights through vLLM's weight-transfer engine (`weights.engine_link`)."""
        return self._all("push_weights_to_rollout", link, send)[0]

    def save(self, directory: str, commit: bool = True) -> str:
        """Collective checkpoint into `directory`; returns the iteration folder. Without `commit` the
        pointer is not moved (the pipeline adds its state first: `checkpoint.commit_checkpoint`)."""
        return str(self._all("save", str(directory), commit)[0])

    def load(self, directory: str) -> dict[str, Any]:
        meta = self._all("load", str(directory))[0]
        self.version = int(meta["policy_version"])
        return meta

    def shutdown(self) -> None:
        """Never hangs, never raises: a dead or hung rank gets `CALL_S`, then every rank is killed."""
        import ray

        if not getattr(self, "actors", None):
            return
        try:
            self._all("shutdown", timeout=CALL_S)
        except Exception:  # noqa: BLE001 - a failed rank is why we are shutting down; kill them all
            pass
        finally:
            for a in self.actors:
                kill_quietly(a)
            self.actors = []
            rdzv = getattr(self, "_rendezvous", None)
            if rdzv is not None:
                rdzv.unlink(missing_ok=True)
            if self._owns_ray:
                ray.shutdown()
