"""One trainer rank: a megatron-core model shard, its optimizer, and the GRPO update of one TrainBatch.

Every rank receives the whole TrainBatch and deterministically picks its data-parallel shard, so the
driver never needs to know the layout. Micro-batches go through megatron's pipeline schedule
(`get_forward_backward_func`: 1F1B when PP > 1) on a model wrapped in megatron's
`DistributedDataParallel` (gradients accumulate in its fp32 buffers); `finalize_model_grads` then
reduces them over data parallelism (all-reduce, or reduce-scatter for the distributed optimizer),
syncs tied embeddings across stages and sequence-parallel norms across TP, and megatron's optimizer
(`get_megatron_optimizer`: Adam, fp32 master weights for bf16/fp16, global-norm clipping, state
sharded over DP with `use_distributed_optimizer`) steps. The loss is aggregated with the whole
minibatch's token and sequence counts (`agg_norm`, `loss_agg_mode`; docs/loss.md) and DP gradients are
summed, so any TP/PP/DP layout and micro-batch size gives the same loss and gradient as TP=1 (up to
float rounding).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asp_npu.arch import ModelDims
from asp_npu.config import Config
from asp_npu.core.layout import actor_layout
from asp_npu.trainer.batching import (
    Estimator,
    Sample,
    agg_norm,
    batch_advantages,
    batch_to_samples,
    make_micro_batches,
    shard_for_dp,
)
from asp_npu.trainer.features import check_features, megatron_features
from asp_npu.trainer.losses import (
    STAT_KEYS,
    KLController,
    LossConfig,
    policy_loss,
    token_kl,
    vocab_parallel_entropy,
)
from asp_npu.trainer.start import RankStart
from asp_npu.types import TrainBatch


def loss_config(cfg: Config) -> LossConfig:
    rl = cfg.rl_config
    return LossConfig(clip_ratio_low=rl.clip_ratio_low, clip_ratio_high=rl.clip_ratio_high,
                      clip_ratio_c=rl.clip_ratio_c, kl_coef=rl.kl_coef, kl_penalty=rl.kl_penalty,
                      use_kl_in_reward=rl.use_kl_in_reward, entropy_coeff=rl.entropy_coeff,
                      loss_agg_mode=rl.loss_agg_mode, importance_cap=rl.importance_cap,
                      temperature=cfg.generate_config.sampling_config.temperature)


def kl_controller(cfg: Config) -> KLController:
    rl = cfg.rl_config
    return KLController(rl.kl_coef, rl.kl_ctrl_type, rl.kl_target, rl.kl_horizon)


class TrainerWorker:
    """One rank of the megatron-core trainer (run directly in a process, or inside a Ray actor)."""

    def __init__(self, cfg: Config, rank: int, world_size: int, master_addr: str = "127.0.0.1",
                 master_port: int = 29500, local_rank: int = 0, start: RankStart | None = None) -> None:
        """`start`: the policy and cores start-up derived (None: what `cfg` alone says)."""
        from asp_npu import device
        from asp_npu.trainer import cpu_compat
        from asp_npu.trainer.parallel import init_parallel

        act = cfg.actor_config
        self.cfg = cfg
        self.rank = rank
        self.rank_start = start or RankStart.of(cfg)
        self.model_path = self.rank_start.policy_path
        self.dims = ModelDims.from_hf_dir(self.model_path)
        self.layout = actor_layout(self.dims, act, world_size)
        check_features(self.dims, act)
        self.kind = device.detect(cfg.trainer.device)
        cores = device.rank_cores(list(self.rank_start.cores), rank, world_size) \
            if self.rank_start.cores and device.spec(self.kind).shared_cores else []
        if cores:
            device.pin_process(cores)
        threads = self.rank_start.threads or len(cores) or max(1, (os.cpu_count() or 1) // world_size)
        torch.set_num_threads(threads)
        device.prepare_megatron(self.kind)
        cpu_compat.prepare(self.kind)
        self.torch_device = device.bind_local_device(self.kind, local_rank)
        init_parallel(device.spec(self.kind).dist_backend, rank, self.layout, master_addr, master_port,
                      act.seed)
        self.loss_cfg = loss_config(cfg)
        self.estimator = Estimator.of(cfg.rl_config)
        self.last_lr = 0.0  # the lr of the latest optimizer step
        self.kl_ctrl = kl_controller(cfg)
        self.step = 0
        self.version = 0
        moe = self._moe_settings()
        self._aux_coeff = float(moe.get("moe_aux_loss_coeff", 0.0))
        self._build({**device.megatron_config_overrides(self.kind), **moe})
        self.offload_train_state()  # colocated: the engines generate first

    # ------------------------------------------------------------------ construction
    def _build(self, overrides: dict[str, Any]) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import get_megatron_optimizer

        from asp_npu import device
        from asp_npu.trainer import lora, optim
        from asp_npu.trainer.convert import load_hf_into_model
        from asp_npu.trainer.megatron_ckpt import initial_weights
        from asp_npu.trainer.model import build_model
        from asp_npu.trainer.offload import Offloader

        act = self.cfg.actor_config
        hf = initial_weights(self.model_path, self.dims, self.rank_start.megatron)
        dtype = self.cfg.model.dtype
        overrides = {**overrides, **megatron_features(act)}
        cp_gather = device.spec(self.kind).cp_gather_attention
        packed_split = act.use_remove_padding and device.spec(self.kind).packed_split_attention

        def loaded_model(state: Any) -> Any:
            model = build_model(self.dims, self.layout, dtype, overrides, cp_gather,
                                packed_split).to(self.torch_device)
            load_hf_into_model(model, state, self.dims, self.layout)
            return self._adapt(model)

        self.module = loaded_model(hf)
        self.lora = lora.LoraSpec.from_actor(act)  # LoRA: base frozen, only adapters reach the optimizer
        if self.lora is not None:
            lora.attach(self.module, self.lora, act.seed)
        self.ref_model = None
        if self.loss_cfg.kl_coef > 0:
            self.ref_model = loaded_model(hf)
            self.ref_model.eval().requires_grad_(False)
        del hf
        # fp32 gradient buffers whatever the weights' dtype; summed (not averaged) over DP because the
        # loss is already normalised by the whole minibatch's token count (calculate_per_token_loss)
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False,
            use_distributed_optimizer=act.use_distributed_optimizer)
        self.model = DistributedDataParallel(self.module.config, ddp_config, self.module)
        self.optimizer = get_megatron_optimizer(optim.optimizer_config(act, dtype), [self.model])
        self.scheduler = optim.build_scheduler(self.optimizer, self.cfg)
        if dtype == "float16":
            self.module.config.grad_scale_func = self.optimizer.scale_loss
        self.offload = {"optimizer": Offloader("optimizer") if act.offload_train_optimizer else None,
                        "param": Offloader("param") if act.offload_train_param else None}

    def _adapt(self, model: Any) -> Any:
        """The loaded model as this worker trains it (the policy: as is; the critic: a value head)."""
        return model

    # ------------------------------------------------------------------ offload (colocated modes)
    def offload_train_state(self) -> None:
        """Move what `offload_train_*` names to host memory (the engines generate meanwhile)."""
        from asp_npu.trainer import memory

        if self.offload["optimizer"] is not None:
            self.offload["optimizer"].offload(memory.optimizer_tensors(self.model, self.optimizer))
        if self.cfg.actor_config.offload_train_grad:
            self.model.offload_grad_buffers()
        if self.offload["param"] is not None:
            self.offload["param"].offload(memory.weight_tensors(self.model))

    def onload_train_state(self) -> None:
        """Bring every offloaded buffer back to the device before the next forward/update."""
        if self.offload["param"] is not None:
            self.offload["param"].restore()
        if self.cfg.actor_config.offload_train_grad:
            self.model.restore_grad_buffers()
        if self.offload["optimizer"] is not None:
            self.offload["optimizer"].restore()

    @contextlib.contextmanager
    def _resident(self, weights_only: bool = False) -> Iterator[None]:
        """Everything offloaded (or only the weights) on the device for the duration of the block."""
        weights = self.offload["param"]
        if weights_only:
            back = weights is not None and weights.offloaded
            if weights is not None and back:
                weights.restore()
            try:
                yield
            finally:
                if weights is not None and back:
                    from asp_npu.trainer import memory

                    weights.offload(memory.weight_tensors(self.model))
            return
        self.onload_train_state()
        try:
            yield
        finally:
            self.offload_train_state()

    def allocated_bytes(self) -> dict[str, int]:
        """Device bytes of this rank's weights, grads and optimizer state (`trainer.memory`; optimizer
        state kept on the host by `optimizer_cpu_offload` is not device memory: `optimizer_bytes`)."""
        from asp_npu.trainer.memory import allocated_bytes

        return {**allocated_bytes(self.model, self.optimizer), "optimizer": self.optimizer_bytes()["device"]}

    def optimizer_bytes(self) -> dict[str, int]:
        """This rank's measured optimizer bytes: `device` (resident on the accelerator) and `host`
        (kept and stepped in host memory by `optimizer_cpu_offload`), `asp_npu.trainer.optim`."""
        from asp_npu.trainer.optim import optimizer_bytes

        return optimizer_bytes(self.model, self.optimizer)

    def _moe_settings(self) -> dict[str, Any]:
        """MoE training settings from model.arch (aux-loss coefficient: the HF config's by default)."""
        if not self.dims.num_experts:
            return {}
        import json

        a = self.cfg.model.arch
        hf = json.loads((Path(self.model_path) / "config.json").read_text())
        return {"moe_aux_loss_coeff": a.moe_aux_loss_coeff or float(hf.get("router_aux_loss_coef", 1e-3)),
                "moe_router_load_balancing_type": a.moe_router_load_balancing_type or "aux_loss"}

    def _moe_aux_loss(self) -> float:
        """Load-balancing losses since the last call, summed over layers and micro-batches (megatron's
        tracker, without the coefficient), then cleared."""
        if not self.dims.num_experts:
            return 0.0
        from megatron.core.transformer.moe import moe_utils

        tracker = moe_utils.get_moe_layer_wise_logging_tracker()
        total = sum(float(v["values"].sum()) for v in tracker.values() if "values" in v)
        moe_utils.clear_aux_losses_tracker()
        return total

    # ------------------------------------------------------------------ parallel helpers
    @staticmethod
    def _ps() -> Any:
        from megatron.core import parallel_state

        return parallel_state

    def _is_loss_rank(self) -> bool:
        """The rank whose statistics count (last pipeline stage, TP rank 0; one per DP rank)."""
        ps = self._ps()
        return ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0

    def _vocab_mask_start(self) -> int | None:
        """Local column from which logits are vocabulary padding (None: no padding on this TP rank)."""
        ps = self._ps()
        from asp_npu.trainer.model import padded_vocab_size

        per = padded_vocab_size(self.dims.vocab_size, self.layout.tp) // self.layout.tp
        start = ps.get_tensor_model_parallel_rank() * per
        pad_from = self.dims.vocab_size - start
        return pad_from if pad_from < per else None

    def _token_logprobs(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """log pi(label) at temperature T from vocab-parallel logits [b, s, V/TP]."""
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        scaled = logits.float() / self.loss_cfg.temperature
        pad_from = self._vocab_mask_start()
        if pad_from is not None:
            col = torch.arange(scaled.shape[-1], device=scaled.device)
            scaled = scaled.masked_fill(col >= pad_from, float("-inf"))
        return -vocab_parallel_cross_entropy(scaled, labels)

    def _token_entropy(self, logits: torch.Tensor) -> torch.Tensor:
        """Entropy [b, s] of pi at temperature T over the whole vocabulary from vocab-parallel logits
        [b, s, V/TP]: the softmax sums are all-reduced over the TP group (megatron's
        reduce_from_tensor_model_parallel_region, identity backward); vocabulary padding excluded.
        Without gradient when entropy_coeff is 0 (then only the metric needs it)."""
        import torch.distributed as dist
        from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region

        group = self._ps().get_tensor_model_parallel_group()

        def max_over_tp(x: torch.Tensor) -> torch.Tensor:
            x = x.clone()
            dist.all_reduce(x, op=dist.ReduceOp.MAX, group=group)
            return x

        tp = self.layout.tp > 1
        grad = contextlib.nullcontext() if self.loss_cfg.entropy_coeff != 0 else torch.no_grad()
        with grad:
            scaled = logits.float() / self.loss_cfg.temperature
            return vocab_parallel_entropy(scaled, self._vocab_mask_start(),
                                          reduce_from_tensor_model_parallel_region if tp else None,
                                          max_over_tp if tp else None)

    def _run_schedule(self, model: Any, micro: list[dict[str, torch.Tensor]], loss_fn: Any,
                      forward_only: bool, with_entropy: bool = False) -> list[dict[str, Any]]:
        """Megatron's forward(-backward) schedule over `micro`; returns the last stage's per-micro dicts
        (`with_entropy`: loss_fn also receives the per-token entropy as `entropy=`)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from asp_npu.trainer import packing

        if not micro:
            return []
        it = iter(enumerate(micro))

        def forward_step(data_iterator: Iterator[Any], mdl: Any) -> tuple[torch.Tensor, Any]:
            k, mb = next(data_iterator)
            if self.dims.num_experts:
                self._scale_aux_loss(mdl, mb["input_ids"].numel(), len(micro))
            out = mdl(mb["input_ids"], mb["position_ids"], None, packed_seq_params=packing.seq_params(mb))

            def loss_func(output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
                logp = packing.unpack(self._token_logprobs(output, mb["labels"]), mb)  # [b, s] either way
                extra = {"entropy": packing.unpack(self._token_entropy(output), mb)} if with_entropy else {}
                loss, info = loss_fn(k, mb, logp, **extra)
                return loss, torch.ones((), dtype=torch.int), info

            return out, loss_func

        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=it, model=[model], num_microbatches=len(micro),
            seq_length=max(int(mb["input_ids"].shape[1]) for mb in micro),
            micro_batch_size=max(int(mb["input_ids"].shape[0]) for mb in micro),
            forward_only=forward_only,
        )

    def _scale_aux_loss(self, model: Any, tokens: int, num_micro: int) -> None:
        """MoE load-balancing loss weight for one micro-batch: megatron multiplies the aux loss by the
        micro-batch's token count (`calculate_per_token_loss`), expecting every gradient to be divided
        by the global token count later; our policy loss is normalised by itself, so divide here. The
        aux gradient is then megatron's intended coefficient x mean over micro-batches and DP ranks."""
        cfg = model.config
        local = tokens // (self.layout.tp if getattr(cfg, "sequence_parallel", False) else 1)
        cfg.moe_aux_loss_coeff = self._aux_coeff / (max(local, 1) * num_micro * self.layout.dp)

    def _my_micro_batches(self, samples: list[Sample]) -> list[dict[str, torch.Tensor]]:
        from asp_npu.trainer import packing

        ps = self._ps()
        mine = shard_for_dp(samples, self.layout.dp, ps.get_data_parallel_rank())
        act = self.cfg.actor_config
        cp = self.layout.cp
        build = packing.packed_micro_batches if act.use_remove_padding else make_micro_batches
        mbs = build(mine, act.micro_batch_size, act.ppo_max_token_len_per_gpu if act.use_dynamic_bsz else 0,
                    (self.layout.tp if act.sequence_parallel else 1) * (2 * cp if cp > 1 else 1))
        if self.dims.num_experts:  # one shape: allgather dispatch over EP, and fixed p2p shapes for PP
            mbs = self._same_shape_over_dp(mbs)
        if cp > 1:  # each context-parallel rank keeps its two chunks of every sequence
            from asp_npu.trainer.context_parallel import split_micro_batch

            mbs = [split_micro_batch(mb, cp, ps.get_context_parallel_rank()) for mb in mbs]
        return [{k: v.to(self.torch_device) for k, v in mb.items()} for mb in mbs]

    def _same_shape_over_dp(self, mbs: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        """MoE: megatron's allgather dispatcher gathers equal-shaped token blocks over the expert-parallel
        ranks, so every data-parallel rank runs as many micro-batches of one [batch, seq] shape (rows
        of padding: mask 0, index -1). Done for any EP, so EP=1 and EP>1 see the same batches."""
        import torch.distributed as dist

        ps = self._ps()
        dims = torch.tensor([len(mbs), max((int(m["input_ids"].shape[0]) for m in mbs), default=1),
                             max((int(m["input_ids"].shape[1]) for m in mbs), default=1)])
        dist.all_reduce(dims, op=dist.ReduceOp.MAX, group=ps.get_data_parallel_group())
        n, b, seq = (int(x) for x in dims)
        out = []
        for k in range(n):
            mb = mbs[k] if k < len(mbs) else None
            padded = {}
            for key in ("input_ids", "labels", "mask", "adv", "behav"):
                t = torch.zeros(b, seq, dtype=torch.long if key in ("input_ids", "labels") else torch.float32)
                if mb is not None:
                    t[:mb[key].shape[0], :mb[key].shape[1]] = mb[key]
                padded[key] = t
            rows = 0 if mb is None else int(mb["index"].shape[0])
            padded["position_ids"] = torch.arange(seq).unsqueeze(0).expand(b, -1).contiguous()
            padded["index"] = torch.full((b,), -1, dtype=torch.long)
            padded["lengths"] = torch.zeros(b, dtype=torch.long)
            padded["resp_len"] = torch.zeros(b, dtype=torch.long)
            if mb is not None:
                padded["index"][:rows] = mb["index"]
                padded["lengths"][:rows] = mb["lengths"]
                padded["resp_len"][:rows] = mb["resp_len"]
            out.append(padded)
        return out

    def _forward_logprobs(self, model: Any, micro: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Per-micro-batch token logprobs [b, s] (on the last stage; empty list elsewhere)."""
        with torch.no_grad():
            store = self._run_schedule(model, micro, lambda k, mb, logp: (logp.sum() * 0, {"logp": logp}),
                                       forward_only=True)
        return [d["logp"].detach() for d in store]

    def _zero_grad(self) -> None:
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _optimizer_step(self, schedule: bool = True) -> float:
        """Reduce gradients (DP, tied embeddings, sequence-parallel norms), clip, step, advance the lr
        schedule (`schedule`); returns the global gradient norm before clipping."""
        from megatron.core.distributed import finalize_model_grads

        from asp_npu.trainer.optim import current_lr

        finalize_model_grads([self.model])
        if schedule:  # the schedule's lr, also after a supervised warm-start set its own
            self.scheduler.step(increment=0)
        self.last_lr = current_lr(self.optimizer)
        ok, norm, _ = self.optimizer.step()
        if ok and schedule:  # MindSpeed-RL: the schedule advances after every successful update
            self.scheduler.step(increment=1)
        if norm is None:  # clip_grad = 0: megatron skips the norm
            norm = self.optimizer.get_grad_norm()
        return float(norm)

    def _reduce_stats(self, sums: dict[str, float], extremes: dict[str, float]) -> tuple[dict, dict]:
        """Sum statistics over data-parallel ranks (counted once per DP rank) and share with all ranks."""
        import torch.distributed as dist

        keys = sorted(sums)
        on = self._is_loss_rank()
        dev = self.torch_device  # HCCL/NCCL reduce device tensors only
        vec = torch.tensor([sums[k] if on else 0.0 for k in keys], dtype=torch.float32, device=dev)
        dist.all_reduce(vec)
        ext_keys = sorted(extremes)
        if not ext_keys:
            return dict(zip(keys, vec.tolist(), strict=True)), {}
        big = float(np.finfo(np.float32).max)
        ext = torch.tensor([(extremes[k] if on else -big) if k.endswith("max") else
                            -(extremes[k] if on else big) for k in ext_keys], dtype=torch.float32, device=dev)
        dist.all_reduce(ext, op=dist.ReduceOp.MAX)
        out_ext = {k: float(v) if k.endswith("max") else -float(v)
                   for k, v in zip(ext_keys, ext, strict=True)}
        return dict(zip(keys, vec.tolist(), strict=True)), out_ext

    # ------------------------------------------------------------------ public API
    def _train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer update (x ppo_epochs) on a complete minibatch of groups; returns metrics."""
        t0 = time.perf_counter()
        # DAPO dynamic sampling filters equal-reward groups in the pipeline, before the minibatch is cut
        samples, dropped = batch_to_samples(batch, False, self.estimator)
        lags = [self.version - v for v in batch.versions]
        metrics: dict[str, float] = {
            "step": float(self.step), "dropped_groups": float(dropped), "samples": float(len(samples)),
            "policy_lag/mean": float(np.mean(lags)) if lags else 0.0,
            "policy_lag/max": float(max(lags)) if lags else 0.0,
        }
        if not samples:  # every group had equal rewards: nothing to learn, keep the version
            metrics.update({"skipped": 1.0, "policy_version": float(self.version)})
            return metrics
        self.model.train()
        beta = self.kl_ctrl.value  # this step's coefficient; the controller moves it after the step
        micro, ref, prox, penalty = self._update_inputs(batch, samples, beta)
        norm = agg_norm(samples, self.cfg)
        epochs = max(1, self.cfg.actor_config.ppo_epochs)
        sums = dict.fromkeys((*STAT_KEYS, "kl_seq_first"), 0.0)
        ext = {"iw_max": -np.inf, "iw_min": np.inf}
        grad_norms = []
        for epoch in range(epochs):
            self._zero_grad()

            def loss_fn(k: int, mb: dict[str, torch.Tensor], logp: torch.Tensor,
                        entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
                if k not in prox:
                    prox[k] = logp.detach()  # proximal policy = weights before this update
                return policy_loss(logp, prox[k], mb["behav"], mb["adv"], mb["mask"], self.loss_cfg, norm,
                                   ref[k] if ref else None, mb["resp_len"], entropy, beta)

            store = self._run_schedule(self.model, micro, loss_fn, forward_only=False, with_entropy=True)
            for st in store:
                for key in STAT_KEYS:
                    sums[key] += float(st[key])
                sums["kl_seq_first"] += float(st["kl_seq"]) if epoch == 0 else 0.0
                ext["iw_max"] = max(ext["iw_max"], float(st["iw_max"]))
                ext["iw_min"] = min(ext["iw_min"], float(st["iw_min"]))
            grad_norms.append(self._optimizer_step())
        sums, ext = self._reduce_stats(sums, ext)
        self.step += 1
        self.version += 1
        elapsed = time.perf_counter() - t0
        metrics.update(self._loss_metrics(sums, ext, epochs, beta, penalty, len(samples)))
        metrics.update({"grad_norm": float(np.mean(grad_norms)), "step_time_s": elapsed,
                        "tokens_per_s": sum(s.length for s in samples) * epochs / elapsed,
                        "policy_version": float(self.version), "skipped": 0.0, "lr": self.last_lr})
        if self.dims.num_experts:
            metrics["moe_aux_loss"] = self._moe_aux_loss() / (epochs * max(len(micro), 1))  # per micro-batch
        return metrics

    def _update_inputs(self, batch: TrainBatch, samples: list[Sample], beta: float) -> tuple[
            list[dict[str, torch.Tensor]], list[torch.Tensor], dict[int, torch.Tensor], float]:
        """Micro-batches, reference logprobs and (KL in the reward) the proximal logprobs of the update.

        With `use_kl_in_reward` each response token's reward loses `beta x` its KL between the proximal
        policy (the weights before this update) and the reference before the advantages are computed,
        as verl's `apply_kl_penalty` followed by its estimator (an outcome estimator sums a sequence's
        token-level rewards, reinforce_plus_plus discounts them per token); returns the mean penalty
        per sample as the last item."""
        micro = self._my_micro_batches(samples)
        ref = self._forward_logprobs(self.ref_model, micro) if self.ref_model is not None else []
        if self.ref_model is None or not self.loss_cfg.use_kl_in_reward:
            return micro, ref, {}, 0.0
        first = self._forward_logprobs(self.model, micro)
        kls = self._token_kls(micro, first, ref, samples)
        penalties = {i: [beta * v for v in row] for i, row in kls.items()}
        adv = batch_advantages(batch, self.estimator, penalties)
        for s in samples:
            s.advantage = adv[s.index]
        return self._my_micro_batches(samples), ref, dict(enumerate(first)), \
            sum(sum(row) for row in penalties.values()) / len(samples)

    def _token_kls(self, micro: list[dict[str, torch.Tensor]], logps: list[torch.Tensor],
                   ref: list[torch.Tensor], samples: list[Sample]) -> dict[int, list[float]]:
        """Each sample's per-response-token KL (0 where its loss mask is 0), by batch index, the same on
        every rank: whole sequences again under context parallelism, then every data-parallel rank's
        last stage gathered."""
        import torch.distributed as dist

        from asp_npu.trainer.context_parallel import gather_sequence

        ps = self._ps()
        span = {s.index: (s.prompt_len - 1, s.length) for s in samples}
        found: dict[int, list[float]] = {}
        for mb, lp, rf in zip(micro, logps, ref, strict=False):  # empty lists off the last stage
            rows = gather_sequence(token_kl(lp, rf, mb["mask"], self.loss_cfg.kl_penalty))
            for j, idx in enumerate(mb["index"].tolist()):
                if idx >= 0:  # not a padding row (MoE with data parallelism)
                    lo, hi = span[idx]
                    found[idx] = rows[j, lo:hi].tolist()
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, found if self._is_loss_rank() and ps.get_context_parallel_rank() == 0
                               else {})
        total: dict[int, list[float]] = {}
        for p in parts:
            total.update(p)
        return total

    def _loss_metrics(self, sums: dict[str, float], ext: dict[str, float], epochs: int, beta: float,
                      penalty: float, n_seqs: int) -> dict[str, float]:
        """Loss metrics of a step (DP-reduced sums) and the KL controller's move: its KL is the mean over
        sequences of each one's per-token KL at the proximal policy (the first epoch's)."""
        tokens = max(sums["tokens"], 1.0)
        out = {
            "loss": sums["loss"] / epochs, "pg_loss": sums["pg_loss"] / epochs,
            "kl": sums["kl"] / tokens, "entropy": sums["entropy"] / tokens, "kl_coef": beta,
            "clip_frac": sums["clipped"] / tokens, "clip_frac_lower": sums["clipped_lower"] / tokens,
            "iw/mean": sums["iw_sum"] / tokens, "iw/max": ext["iw_max"], "iw/min": ext["iw_min"],
            "iw/truncated_frac": sums["iw_truncated"] / tokens, "response_tokens": sums["tokens"] / epochs,
        }
        if self.loss_cfg.use_kl_in_reward:
            out["kl_reward_penalty"] = penalty
        if self.ref_model is not None:  # the controller's input, logged so a run can be checked against it
            out["kl_seq_mean"] = sums["kl_seq_first"] / n_seqs
            self.kl_ctrl.update(out["kl_seq_mean"], n_seqs)
        return out

    def _sft_step(self, batch: TrainBatch, lr: float | None = None) -> dict[str, float]:
        """One supervised update: mean negative log-likelihood of the response tokens (token level)."""
        t0 = time.perf_counter()
        if lr is not None:
            self.set_lr(lr)
        samples = [Sample(i, list(t.prompt_token_ids) + list(t.response_token_ids), len(t.prompt_token_ids),
                          0.0, [0.0] * len(t.response_token_ids), list(t.loss_mask) or None)
                   for i, t in enumerate(batch.trajectories) if t.response_token_ids]
        norm = float(sum(s.response_len for s in samples))
        micro = self._my_micro_batches(samples)
        self.model.train()
        self._zero_grad()

        def loss_fn(k: int, mb: dict[str, torch.Tensor], logp: torch.Tensor) -> tuple[torch.Tensor, dict]:
            nll = -(logp * mb["mask"]).sum() / norm
            return nll, {"loss": nll.detach(), "tokens": mb["mask"].sum()}

        sums = {"loss": 0.0, "tokens": 0.0}
        for st in self._run_schedule(self.model, micro, loss_fn, forward_only=False):
            sums["loss"] += float(st["loss"])
            sums["tokens"] += float(st["tokens"])
        grad_norm = self._optimizer_step(schedule=lr is None)
        sums, _ = self._reduce_stats(sums, {})
        self.step += 1
        self.version += 1
        elapsed = time.perf_counter() - t0
        return {"loss": sums["loss"], "grad_norm": grad_norm, "response_tokens": sums["tokens"],
                "tokens_per_s": sum(s.length for s in samples) / elapsed, "step_time_s": elapsed,
                "policy_version": float(self.version)}

    def hold_step(self) -> dict[str, float]:
        """A step without an update (PPO's critic warm-up, verl `critic_warmup`): the version advances so
        the rollout's weights refresh stays in order; the weights and the lr schedule stay."""
        self.step += 1
        self.version += 1
        return {"step": float(self.step - 1), "skipped": 1.0, "policy_version": float(self.version)}

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _compute_logprobs(self, batch: TrainBatch) -> list[list[float]]:
        """Current-policy logprobs of every trajectory's response tokens (same order as the batch)."""
        import torch.distributed as dist

        ps = self._ps()
        samples = [Sample(i, list(t.prompt_token_ids) + list(t.response_token_ids), len(t.prompt_token_ids),
                          0.0, [0.0] * len(t.response_token_ids))
                   for i, t in enumerate(batch.trajectories) if t.response_token_ids]
        micro = self._my_micro_batches(samples)
        self.model.eval()
        found: dict[int, list[float]] = {}
        if micro:
            from asp_npu.trainer.context_parallel import gather_sequence

            for mb, logp in zip(micro, self._forward_logprobs(self.model, micro), strict=False):
                logp = gather_sequence(logp)  # whole sequences again under context parallelism
                for j, idx in enumerate(mb["index"].tolist()):
                    if idx < 0:  # a padding row (MoE with data parallelism)
                        continue
                    s = next(x for x in samples if x.index == idx)
                    found[idx] = logp[j, s.prompt_len - 1:s.length].tolist()
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, found if self._is_loss_rank() and ps.get_context_parallel_rank() == 0
                               else {})
        merged: dict[int, list[float]] = {}
        for p in parts:
            merged.update(p)
        return [merged.get(i, []) for i in range(len(batch.trajectories))]

    def _get_hf_weights(self) -> Any:
        """This pipeline stage's full HF tensors (numpy) on its TP-0/DP-0 rank, else None; + version."""
        from asp_npu.trainer.convert import megatron_stage_to_hf, to_numpy
        from asp_npu.trainer.lora import merged_state
        from asp_npu.weights.hf import HFWeights

        ps = self._ps()
        tensors = megatron_stage_to_hf(self.module, self.dims,
                                       merged_state(self.module) if self.lora is not None else None)
        if (ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0
                and ps.get_context_parallel_rank() == 0):
            return HFWeights(self.version, to_numpy(tensors))
        return None

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer update (x ppo_epochs) on a complete minibatch of groups; returns metrics."""
        with self._resident():
            return self._train_step(batch)

    def sft_step(self, batch: TrainBatch, lr: float | None = None) -> dict[str, float]:
        """One supervised update: mean negative log-likelihood of the response tokens (token level)."""
        with self._resident():
            return self._sft_step(batch, lr)

    def compute_logprobs(self, batch: TrainBatch) -> list[list[float]]:
        """Current-policy logprobs of every trajectory's response tokens (same order as the batch)."""
        with self._resident(weights_only=True):
            return self._compute_logprobs(batch)

    def get_hf_weights(self) -> Any:
        """This pipeline stage's full HF tensors (numpy) on its TP-0/DP-0 rank, else None; + version."""
        with self._resident(weights_only=True):
            return self._get_hf_weights()

    def push_weights_to_rollout(self, link: Any, send: bool = True) -> Any:
        """weight_refresh through vLLM's weight-transfer engine (`asp_npu.weights.engine_link`): every
        rank joins the HF gather, pipeline stages meet on rank 0, rank 0 connects (first call) and sends."""
        from torch import distributed as dist

        from asp_npu.weights.engine_link import push_from_trainer

        hf = self.get_hf_weights() if send else None
        if send and self._ps().get_pipeline_model_parallel_world_size() > 1:
            parts: list[Any] = [None] * dist.get_world_size() if self.rank == 0 else []
            dist.gather_object(hf, parts if self.rank == 0 else None, dst=0)
            hf = parts[0] if self.rank == 0 else None
            for p in parts[1:]:
                if p is not None and hf is not None:
                    hf.tensors.update(p.tensors)
        if self.rank != 0:
            return None
        return push_from_trainer(link, hf.tensors.items() if hf is not None else None, self.version)

    def save(self, directory: str, commit: bool = True) -> str:
        from asp_npu.trainer.checkpoint import save_checkpoint

        with self._resident():
            return str(save_checkpoint(directory, self, commit))

    def load(self, directory: str) -> dict[str, Any]:
        from asp_npu.trainer.checkpoint import load_checkpoint

        with self._resident():
            return load_checkpoint(directory, self)

    def shutdown(self) -> None:
        from asp_npu.trainer.parallel import destroy_parallel

        destroy_parallel()
