"""LoRA weight refresh: a real LoRA trainer's merged weights (W + alpha/r B A) through the refresh path
to a real vLLM instance, checked greedy token for token against the merged HF model; time and bytes
of the LoRA-merged refresh next to a full-weights trainer's, and the adapters-only payload.

    python benchmarks/lora_refresh.py --size tiny --repeats 3

Trainer side (one megatron rank, gloo): `get_hf_weights` timed (LoRA: merge + TP gather; full: gather).
Engine side: `TransferEngineLink.publish` (vLLM's weight-transfer engine over gloo): send and load time,
bytes. The adapters-only figure is the size of the adapter tensors (what a vLLM LoRA refresh would send).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path
from typing import Any

LORA = {"lora_r": 8, "lora_alpha": 16.0,
        "lora_target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]}


def _batch(vocab: int, seed: int) -> Any:
    import random

    from asp_npu.types import TrainBatch, Trajectory

    rng = random.Random(seed)
    trajs = []
    for g in range(2):
        prompt = [rng.randrange(3, vocab) for _ in range(6)]
        for s in range(4):
            resp = [rng.randrange(3, vocab) for _ in range(rng.randint(4, 12))]
            trajs.append(Trajectory(prompt_id=f"p{g}", sample_idx=s, prompt_token_ids=prompt,
                                    response_token_ids=resp, logprobs=[-5.0] * len(resp),
                                    finish_reason="stop",
                                    reward=float(s % 2), policy_version=0))
    return TrainBatch(trajectories=trajs, group_size=4)


def _trainer(model_dir: str, lora: bool, port: int, repeats: int, out: Any) -> None:
    """One trainer rank: 2 GRPO steps (lr large enough that adapters move the greedy tokens), then
    `repeats` timed `get_hf_weights` calls; puts the HF tensors and timings on `out`."""
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
                       "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    from asp_npu.arch import ModelDims
    from asp_npu.config import Config
    from asp_npu.trainer.lora import adapter_tensors
    from asp_npu.trainer.worker import TrainerWorker

    cfg = Config()
    cfg.model.path = model_dir
    cfg.trainer.device = "cpu"
    a = cfg.actor_config
    a.micro_batch_size, a.lr, a.clip_grad, a.num_threads = 4, 5e-2 if lora else 1e-3, 0.0, 1
    if lora:
        for k, v in LORA.items():
            setattr(a, k, v)
    w = TrainerWorker(cfg, 0, 1, master_port=port)
    vocab = ModelDims.from_hf_dir(model_dir).vocab_size
    for i in range(2):
        w.train_step(_batch(vocab, i))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        hf = w.get_hf_weights()
        times.append(time.perf_counter() - t0)
    adapters = {k: v.numpy() for k, v in adapter_tensors(w.module).items()}
    out.put({"tensors": hf.tensors, "gather_s": times, "adapters": adapters,
             "trainable": sum(p.numel() for p in w.module.parameters() if p.requires_grad),
             "optimizer_bytes": w.optimizer_bytes()["device"]})


def train(model_dir: str, lora: bool, repeats: int) -> dict[str, Any]:
    from asp_npu.net import free_port

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_trainer, args=(model_dir, lora, free_port(), repeats, q))
    p.start()
    res = q.get(timeout=600)
    p.join(60)
    return res


def hf_model(model_dir: str, tensors: dict[str, Any]) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if not tensors:
        return model
    missing, _ = model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=False)
    assert all(k == "lm_head.weight" for k in missing), missing  # tied head
    return model


def hf_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def refresh_and_compare(model_dir: str, states: dict[str, dict[str, Any]], repeats: int,
                        tokens: int = 16) -> dict[str, Any]:
    """Publish each state `repeats` times to one real vLLM instance; after each state's refresh, greedy
    tokens vs the HF model holding that state."""
    import ray

    from asp_npu.data.tasks import make_prompts
    from asp_npu.rollout.engine import EngineSettings, SamplingSettings
    from asp_npu.rollout.instance import launch_instances
    from asp_npu.weights.engine_link import RayTrainer, StateDictTrainer, TransferEngineLink

    settings = EngineSettings(model_dir, max_model_len=256, max_num_seqs=8)
    (inst,) = launch_instances(1, settings, SamplingSettings(), kind="cpu", kv_cache_gib=0.5)
    actor = ray.remote(StateDictTrainer).options(num_cpus=0).remote()
    sync = TransferEngineLink(kind="cpu", drain=True, timeout_s=300)
    items = make_prompts("count", 4, seed=11)
    greedy = SamplingSettings(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    out: dict[str, Any] = {}
    version, unit = 0, 0
    try:
        for name, state in states.items():
            sends, loads = [], []
            for _ in range(repeats):
                version += 1
                ray.get(actor.set_weights.remote(state, version))
                if version == 1:
                    sync.connect([inst], RayTrainer(actor))
                res = sync.publish(version)
                sends.append(res["send_s"])
                loads.append(res["instances"][0]["load_s"])
                nbytes = res["instances"][0]["num_bytes"]
            units = [{"unit": unit + k, "samples": [{"prompt_id": it.prompt_id, "sample_idx": 0}]}
                     for k, it in enumerate(items)]
            unit += len(items)
            ray.get(inst.run_plan.remote(units, items, greedy, 300))
            trajs = [t for g in ray.get(inst.poll.remote()) for t in g]
            model = hf_model(model_dir, state)
            same = [t.response_token_ids == hf_greedy(model, t.prompt_token_ids, tokens) for t in trajs]
            out[name] = {"bytes": nbytes, "send_s": sends, "load_s": loads, "greedy_equal": same,
                         "responses": [t.response_token_ids for t in trajs],
                         "prompts": [list(t.prompt_token_ids) for t in trajs]}
    finally:
        sync.close()
        ray.get(inst.shutdown.remote())
        ray.kill(inst)
        ray.kill(actor)
    return out


def peft_adapter(model_dir: str, adapters: dict[str, Any], out: Path) -> Path:
    """The TP=1 megatron adapters as a PEFT LoRA folder on HF names (q/k/v share linear_qkv's A and split
    its B; gate/up share linear_fc1's A and split its B), what vLLM's LoRA support loads."""
    import torch
    from safetensors.torch import save_file

    from asp_npu.arch import ModelDims
    from asp_npu.trainer.convert import _qkv_split

    dims = ModelDims.from_hf_dir(model_dir)
    t = {k: torch.from_numpy(v) for k, v in adapters.items()}
    tensors: dict[str, torch.Tensor] = {}

    def put(layer: int, hf: str, a: torch.Tensor, b: torch.Tensor) -> None:
        pre = f"base_model.model.model.layers.{layer}.{hf}"
        tensors[pre + ".lora_A.weight"], tensors[pre + ".lora_B.weight"] = a.clone(), b.clone()

    for i in range(dims.num_layers):
        m = f"decoder.layers.{i}."
        qkv_a, qkv_b = t[m + "self_attention.linear_qkv.lora_A"], t[m + "self_attention.linear_qkv.lora_B"]
        for name, b in zip(("q_proj", "k_proj", "v_proj"), _qkv_split(qkv_b, dims), strict=True):
            put(i, f"self_attn.{name}", qkv_a, b)
        put(i, "self_attn.o_proj", t[m + "self_attention.linear_proj.lora_A"],
            t[m + "self_attention.linear_proj.lora_B"])
        gate, up = t[m + "mlp.linear_fc1.lora_B"].chunk(2)
        put(i, "mlp.gate_proj", t[m + "mlp.linear_fc1.lora_A"], gate)
        put(i, "mlp.up_proj", t[m + "mlp.linear_fc1.lora_A"], up)
        put(i, "mlp.down_proj", t[m + "mlp.linear_fc2.lora_A"], t[m + "mlp.linear_fc2.lora_B"])
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": model_dir,
        "r": LORA["lora_r"], "lora_alpha": LORA["lora_alpha"], "lora_dropout": 0.0, "bias": "none",
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}))
    return out


def try_vllm_lora(model_dir: str, adapter_dir: Path, prompts: list[list[int]], want: list[list[int]],
                  tokens: int = 16) -> dict[str, Any]:
    """vLLM (in this process) with `enable_lora`: greedy tokens of the base model + the adapter vs the
    merged HF model's; on failure the exception's first line."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest

        llm = LLM(model=model_dir, enable_lora=True, max_lora_rank=LORA["lora_r"], max_loras=1,
                  enforce_eager=True, max_model_len=256, max_num_seqs=8, dtype="float32")
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                            lora_request=LoRARequest("adapter", 1, str(adapter_dir)))
        first_s = time.perf_counter() - t0  # includes loading the adapter
        got = [list(o.outputs[0].token_ids) for o in outs]
        return {"served": True, "greedy_equal": [g == w for g, w in zip(got, want, strict=True)],
                "first_generate_s": first_s}
    except Exception as exc:  # noqa: BLE001  (record exactly what failed)
        first = str(exc).splitlines()[0] if str(exc) else ""
        return {"served": False, "error": f"{type(exc).__name__}: {first}"}


def run(size: str, repeats: int, workdir: Path) -> dict[str, Any]:
    import ray

    from asp_npu.data.init_model import build_model_dir

    model_dir = str(build_model_dir(workdir / "base", size=size, seed=3))
    lora, full = train(model_dir, True, repeats), train(model_dir, False, repeats)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        eng = refresh_and_compare(model_dir, {"lora_merged": lora["tensors"], "full": full["tensors"]},
                                  repeats)
    finally:
        ray.shutdown()
    base = hf_model(model_dir, {})
    prompts = eng["lora_merged"]["prompts"]
    merged_greedy = [hf_greedy(hf_model(model_dir, lora["tensors"]), p, 16) for p in prompts]
    try:
        adapter_dir = peft_adapter(model_dir, lora["adapters"], workdir / "adapter")
        vllm_lora = try_vllm_lora(model_dir, adapter_dir, prompts, merged_greedy)
    except Exception as exc:  # noqa: BLE001  (the merged-refresh figures stand without it)
        vllm_lora = {"served": False, "error": f"adapter export: {type(exc).__name__}: {exc}"}
    return {
        "vllm_lora": vllm_lora,
        "size": size, "repeats": repeats,
        "lora": {"gather_s": lora["gather_s"], **eng["lora_merged"],
                 "trainable_params": lora["trainable"],
                 "optimizer_bytes": lora["optimizer_bytes"],
                 "adapter_bytes": sum(v.nbytes for v in lora["adapters"].values())},
        "full": {"gather_s": full["gather_s"], **eng["full"], "trainable_params": full["trainable"],
                 "optimizer_bytes": full["optimizer_bytes"]},
        "lora_changes_greedy": eng["lora_merged"]["responses"] != [
            hf_greedy(base, p, 16) for p in eng["lora_merged"]["prompts"]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny", choices=("tiny", "small"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        res = run(args.size, args.repeats, Path(d))
    text = json.dumps(res, indent=1, default=float)
    if args.out:
        Path(args.out).write_text(text)
    med = {k: {m: sorted(res[k][m])[len(res[k][m]) // 2] for m in ("gather_s", "send_s", "load_s")}
           for k in ("lora", "full")}
    print(json.dumps({"median": med, "bytes": {k: res[k]["bytes"] for k in ("lora", "full")},
                      "adapter_bytes": res["lora"]["adapter_bytes"],
                      "greedy_equal": {k: res[k]["greedy_equal"] for k in ("lora", "full")},
                      "lora_changes_greedy": res["lora_changes_greedy"], "vllm_lora": res["vllm_lora"]},
                     indent=1))


if __name__ == "__main__":
    main()
