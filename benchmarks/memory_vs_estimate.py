"""`asp-npu check`'s weights / gradients / optimizer bytes vs what megatron-core allocates per rank.

    python benchmarks/memory_vs_estimate.py [--hidden 256 --layers 4 --vocab 2048]

Builds a tiny Qwen2-shaped GPTModel with megatron-core's own training machinery -- DistributedDataParallel
(fp32 gradient buffer, as megatron trains bf16) and `get_megatron_optimizer` (Adam) -- in spawned
processes over gloo at world size 1 and 2 (data parallel), takes one optimizer step so Adam's state
exists, and counts each distinct tensor storage once: the parameters (views of DDP's buffer when
the distributed optimizer is on), DDP's gradient buffers, and the optimizer's fp32 master weights and
moments. The estimator (`asp_npu.deploy.memory.trainer_memory`) gets the same dimensions and layout.
Prints a Markdown table; exits 1 if any component is off by more than 5%.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import traceback
from typing import Any

CASES = [  # (dtype, world size = DP, use_distributed_optimizer)
    ("bfloat16", 1, True),
    ("bfloat16", 2, True),
    ("bfloat16", 2, False),
    ("float32", 2, True),
]
TOLERANCE = 0.05


def _dims(args: argparse.Namespace) -> dict[str, Any]:
    heads = 8
    return dict(
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 3,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=2,
        head_dim=args.hidden // heads,
        vocab_size=args.vocab,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )


def _storages(tensors: list[Any], skip: set[int] | None = None) -> dict[int, int]:
    """storage id -> bytes, each storage once."""
    out: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        sid = int(s._cdata)
        if skip is None or sid not in skip:
            out[sid] = s.nbytes()
    return out


def _megatron_optimizer_on_cpu() -> None:
    """megatron's optimizer sorts parameters by `tensor.type() == 'torch.cuda.FloatTensor'`; until the
    CPU compatibility module answers that for megatron (the trainer's move onto megatron's optimizer
    adds it), answer it here, for megatron's callers only."""
    import torch

    from asp_npu.trainer import cpu_compat

    if getattr(torch.Tensor.type, "__module__", "") == cpu_compat.__name__:
        return
    plain = torch.Tensor.type

    def typed(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kw: Any) -> Any:
        if dtype is not None or kw:
            return plain(self, dtype, non_blocking, **kw)
        name = plain(self)
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if self.device.type == "cpu" and caller.startswith("megatron."):
            return "torch.cuda." + name[len("torch.") :]
        return name

    torch.Tensor.type = typed  # type: ignore[method-assign,assignment]


def _rank(rank: int, world: int, port: int, hf: dict[str, Any], dtype: str, dist_opt: bool, q: Any) -> None:
    try:
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"})
        import torch

        from asp_npu.device import prepare_megatron

        prepare_megatron("cpu")
        _megatron_optimizer_on_cpu()
        torch.set_num_threads(1)
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        from asp_npu.arch import ModelDims
        from asp_npu.core.layout import ParallelLayout
        from asp_npu.trainer.model import DTYPES, build_model
        from asp_npu.trainer.parallel import destroy_parallel, init_parallel

        dims = ModelDims.from_hf_dict(hf)
        layout = ParallelLayout(1, 1, world)
        init_parallel("gloo", rank, layout, "127.0.0.1", port, seed=1234)
        module = build_model(dims, layout, dtype, {"use_cpu_initialization": True})
        if dtype != "float32":
            from megatron.core.transformer.module import Float16Module

            module = Float16Module(module.config, module)
        ddp = DistributedDataParallel(
            module.config,
            DistributedDataParallelConfig(
                grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=dist_opt
            ),
            module,
        )
        opt = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=1e-4,
                bf16=dtype == "bfloat16",
                params_dtype=DTYPES[dtype],
                use_distributed_optimizer=dist_opt,
                clip_grad=0.0,
            ),
            [ddp],
        )
        ddp.module.config.finalize_model_grads_func = finalize_model_grads
        ids = torch.randint(0, dims.vocab_size, (1, 16))
        pos = torch.arange(16).unsqueeze(0)
        opt.zero_grad()
        ddp.zero_grad_buffer()
        loss = ddp(ids, pos, None, labels=ids).float().mean()
        loss.backward()
        finalize_model_grads([ddp])
        opt.step()
        weights = _storages(list(ddp.parameters()))
        grads = _storages([b.grad_data for b in ddp.buffers + ddp.expert_parallel_buffers])
        parts = getattr(opt, "chained_optimizers", None) or [opt]
        state: list[Any] = []
        for part in parts:
            inner = part.optimizer
            for group in inner.param_groups:
                state += [p for p in group["params"] if isinstance(p, torch.Tensor)]
            for st in inner.state.values():
                state += [v for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
        optimizer = _storages(state, skip=set(weights))
        n_params = sum(p.numel() for p in ddp.parameters())
        q.put((rank, "ok", (sum(weights.values()), sum(grads.values()), sum(optimizer.values()), n_params)))
        destroy_parallel()
    except Exception:
        q.put((rank, "error", traceback.format_exc()))


def measure(hf: dict[str, Any], dtype: str, world: int, dist_opt: bool) -> list[tuple[int, int, int, int]]:
    from asp_npu.net import free_port

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, hf, dtype, dist_opt, q)) for r in range(world)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    try:
        for _ in range(world):
            rank, status, value = q.get(timeout=600)
            if status != "ok":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(world)]


def estimate(hf: dict[str, Any], dtype: str, world: int, dist_opt: bool) -> tuple[float, float, float]:
    from asp_npu.config import Config
    from asp_npu.deploy.arch import resolve_arch
    from asp_npu.deploy.layout import card_for
    from asp_npu.deploy.memory import GIB, trainer_memory

    cfg = Config()
    cfg.model.path = "/nonexistent"
    cfg.model.dtype = dtype
    a = cfg.model.arch
    a.hidden_size, a.num_layers = hf["hidden_size"], hf["num_hidden_layers"]
    a.num_attention_heads, a.num_key_value_heads = hf["num_attention_heads"], hf["num_key_value_heads"]
    a.vocab_size, a.intermediate_size = hf["vocab_size"], hf["intermediate_size"]
    a.max_position_embeddings, a.model_type = hf["max_position_embeddings"], "qwen2"
    cfg.actor_config.data_parallel_size = world
    cfg.actor_config.use_distributed_optimizer = dist_opt
    arch, problems, _ = resolve_arch(cfg)
    assert arch is not None and not problems, problems
    parts = trainer_memory(cfg, arch, card_for("910b"))[0].parts
    return parts["weights"] * GIB, parts["gradients"] * GIB, parts["optimizer"] * GIB


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=2048)
    args = p.parse_args(argv)
    hf = _dims(args)
    print(f"tiny Qwen2-shaped model: {hf}")
    print(
        "| dtype | DP | distributed optimizer | rank | params | weights MiB meas / est "
        "| grads MiB meas / est | optimizer MiB meas / est | worst error |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for dtype, world, dist_opt in CASES:
        est = estimate(hf, dtype, world, dist_opt)
        for rank, (*meas, n) in enumerate(measure(hf, dtype, world, dist_opt)):
            errs = [abs(m - e) / m for m, e in zip(meas, est, strict=True)]
            worst = max(worst, *errs)
            cells = " | ".join(f"{m / 2**20:.3f} / {e / 2**20:.3f}" for m, e in zip(meas, est, strict=True))
            row = f"| {dtype} | {world} | {dist_opt} | {rank} | {n:,} | {cells} | {max(errs):.2%} |"
            print(row, flush=True)
    print(f"worst relative error {worst:.2%} (tolerance {TOLERANCE:.0%})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
