"""weight_refresh end to end, old path vs new, side by side in one run (real vLLM engines on CPU).

For each model, `--instances` RolloutInstance actors and one trainer-side sender actor (holding the
HF state dict, as trainer rank 0 does after its gather); every refresh ships freshly perturbed
weights under a new version, the two paths alternating:

- old: the object-store path (`TransferEngineLink(backend="object-store")`): the driver fetches the trainer's
  HF weights, makes one safetensors blob, `ray.put`s it, every instance loads it with `reload_weights`
  through `collective_rpc`;
- new: vLLM's weight-transfer engine (`TransferEngineLink()`, `gloo` on CPU): trainer rank 0 broadcasts
  buckets to every instance worker, which loads them through vLLM's layerwise reload.

Two situations: drained (no sequence running) and in flight (sequences running; old = load between
two engine steps, `refresh_weights(drain=False)`; new = `pause_generation(mode="keep")` / resume).
Reported: the driver's wall seconds per refresh (median of `--repeats`), and for in flight the
seconds the running sequences were frozen (old: the load inside the worker; new: pause to resume).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/weight_refresh.py [--models tiny,small,1gib] \
        [--repeats 3] [--instances 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from asp_npu.device import loopback_env
from asp_npu.io import atomic_write_json
from asp_npu.weights.engine_link import StateDictTrainer


class BenchTrainer(StateDictTrainer):
    """The sender actor, perturbing its own weights between refreshes (nothing big crosses the driver)."""

    def load(self, model_dir: str) -> int:
        from safetensors.torch import load_file

        state: dict[str, Any] = {}
        for f in sorted(Path(model_dir).glob("*.safetensors")):
            state.update(load_file(str(f)))
        self.state = state
        return sum(t.numel() * t.element_size() for t in state.values())

    def perturb(self, seed: int, version: int) -> None:
        import torch

        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for t in self.state.values():
                t.add_(1e-3 * torch.randn(t.shape, generator=gen, dtype=t.dtype))
        self.version = version


def build_1gib(out: Path, tokenizer_from: Path) -> Path:
    """An untied Qwen2 of ~1 GiB fp32 (272M parameters), with the small model's tokenizer."""
    import torch
    from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

    small = AutoConfig.from_pretrained(str(tokenizer_from))
    cfg = Qwen2Config(
        vocab_size=small.vocab_size,
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=18,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        hidden_act="silu",
        rms_norm_eps=1e-6,
        pad_token_id=small.pad_token_id,
        bos_token_id=small.bos_token_id,
        eos_token_id=small.eos_token_id,
        dtype="float32",
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    out.mkdir()
    for f in tokenizer_from.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name not in ("config.json",):
            shutil.copy(f, out / f.name)
    model.save_pretrained(str(out))
    return out


def model_dir(name: str, root: Path) -> Path:
    from asp_npu.data.init_model import build_model_dir

    if name in ("tiny", "small"):
        return root / name if (root / name).exists() else build_model_dir(root / name, size=name, seed=0)
    if name == "1gib":
        small = root / "small" if (root / "small").exists() else build_model_dir(root / "small", size="small")
        return build_1gib(root / "1gib", small)
    raise SystemExit(f"unknown model '{name}' (tiny, small, 1gib)")


def inflight_units(ray: Any, instances: list, sampling: Any, first: int, seqs: int) -> None:
    from asp_npu.data.tasks import make_prompts

    items = make_prompts("count", len(instances), seed=first)
    for k, (inst, it) in enumerate(zip(instances, items, strict=True)):
        ray.get(inst.add_prompts.remote([it]))
        unit = {
            "unit": first + k,
            "samples": [{"prompt_id": it.prompt_id, "sample_idx": i} for i in range(seqs)],
        }
        ray.get(inst.submit_units.remote([unit], sampling))
    while (
        min(ray.get([i.stats.remote() for i in instances]), key=lambda s: s["in_flight"])["in_flight"] < seqs
    ):
        time.sleep(0.01)
    time.sleep(0.3)


def bench_model(
    name: str, root: Path, repeats: int, num_instances: int, paths: tuple[str, ...] = ("new", "old")
) -> dict[str, Any]:
    import ray

    from asp_npu.rollout.engine import EngineSettings, SamplingSettings
    from asp_npu.rollout.instance import launch_instances
    from asp_npu.weights.engine_link import RayTrainer, TransferEngineLink

    path = model_dir(name, root)
    big = name == "1gib"
    settings = EngineSettings(str(path), max_model_len=2048, max_num_seqs=8, enable_prefix_caching=False)
    instances = launch_instances(num_instances, settings, SamplingSettings(), kind="cpu", kv_cache_gib=0.5)
    actor = ray.remote(BenchTrainer).options(num_cpus=0).remote()
    nbytes = ray.get(actor.load.remote(str(path)))
    trainer = RayTrainer(actor)
    old = TransferEngineLink(backend="object-store", timeout_s=600)
    new = TransferEngineLink(kind="cpu", timeout_s=600)
    old.connect(instances, trainer)
    t0 = time.perf_counter()
    new.connect(instances, trainer)
    res: dict[str, Any] = {"model": name, "bytes": nbytes, "connect_s": time.perf_counter() - t0}
    version = 0
    long = SamplingSettings(max_tokens=300 if big else 1500, ignore_eos=True, seed=1)
    try:
        # the new path first: on a small machine the old one can run out of memory at 1 GiB x 2
        # instances (Ray then kills the instances), and that must not cost the new path's figures
        for label, sync in [(p, {"new": new, "old": old}[p]) for p in paths]:
            try:
                for situation in ("drained", "inflight"):
                    sync.set_drain(situation == "drained")
                    for r in range(repeats):
                        version += 1
                        ray.get(actor.perturb.remote(version, version))
                        if situation == "inflight":
                            inflight_units(ray, instances, long, 1000 * version, 4)
                        t0 = time.perf_counter()
                        reps = sync.publish(version)["instances"]
                        wall = time.perf_counter() - t0
                        key = f"{situation}/{label}"
                        res.setdefault(f"{key}/wall_s", []).append(wall)
                        res.setdefault(f"{key}/load_s", []).append(max(rep["load_s"] for rep in reps))
                        if situation == "inflight":
                            frozen = max(rep["load_s"] if label == "old" else rep["frozen_s"] for rep in reps)
                            res.setdefault(f"{key}/frozen_s", []).append(frozen)
                            ray.get([i.wait_idle.remote(600) for i in instances])
                            ray.get([i.poll.remote() for i in instances])
                        print(f"  {name} {situation} {label} run {r + 1}: {wall:.3f} s", flush=True)
            except Exception as exc:  # recorded in the table instead of the figure
                res[f"{label}/error"] = str(exc).splitlines()[0][:160]
                print(f"  {name} {label}: {res[f'{label}/error']}", flush=True)
                break
    finally:
        new.close()
        for a in [*instances, actor]:
            try:
                if a is not actor:
                    ray.get(a.shutdown.remote(), timeout=60)
            except Exception:  # an instance the memory monitor killed
                pass
            ray.kill(a)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,small,1gib")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--json", default="", help="also write the raw figures here")
    ap.add_argument("--paths", default="new,old", help="which paths to run, in this order")
    args = ap.parse_args()
    os.environ.update(
        {**loopback_env(), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "TOKENIZERS_PARALLELISM": "false"}
    )
    import ray

    ray.init(num_cpus=max(2, args.instances), include_dashboard=False, log_to_driver=False)
    root = Path(tempfile.mkdtemp(prefix="weight-refresh-"))
    print(
        f"{args.instances} instances, median of {args.repeats}; seconds "
        "(driver wall; frozen = running sequences stopped)"
    )
    print(HEADER, flush=True)
    results = []
    try:
        for name in args.models.split(","):
            results.append(
                bench_model(name, root, args.repeats, args.instances, tuple(args.paths.split(",")))
            )
            print(row(results[-1]), flush=True)
            if args.json:
                atomic_write_json(args.json, results, indent=1)
    finally:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    print("\n" + HEADER + "\n" + "\n".join(row(r) for r in results))


HEADER = (
    "| model | MiB | connect (new, once) | drained old | drained new | in flight old | in flight new "
    "| frozen old | frozen new |\n|---|---|---|---|---|---|---|---|---|"
)


def row(r: dict[str, Any]) -> str:
    def cell(key: str) -> str:
        values = r.get(key)
        return f"{statistics.median(values):.3f}" if values else "failed"

    cols = [
        f"{s}/{p}/{m}"
        for m, s in (("wall_s", "drained"), ("wall_s", "inflight"), ("frozen_s", "inflight"))
        for p in ("old", "new")
    ]
    errors = "; ".join(f"{p}: {r[f'{p}/error']}" for p in ("old", "new") if f"{p}/error" in r)
    return (
        f"| {r['model']} | {r['bytes'] / 2**20:.0f} | {r['connect_s']:.2f} | "
        + " | ".join(cell(c) for c in cols)
        + " |"
        + (f" {errors}" if errors else "")
    )


if __name__ == "__main__":
    main()
