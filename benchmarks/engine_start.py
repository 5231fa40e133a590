"""One vLLM engine's start inside a Ray actor, vLLM's multiprocess executor vs the uni executor the
CPU path uses (`device.rollout_env`), side by side in one run, alternating.

Reported per start: the actor's imports, building the engine (`VLLMEngine(...)`: the engine-core
process spawned, the model loaded, the KV cache made), the first batch (vLLM's one-off warm-up
included) and a second batch's tokens/s (64 prompts x 128 tokens, `ignore_eos`), so a lighter start
that generates slower would show.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/engine_start.py MODEL_DIR [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

from asp_npu.device import init_ray


class Starter:
    """The Ray actor that builds one engine, as a rollout instance does."""

    def run(self, model: str, executor: str) -> dict[str, float]:
        t0 = time.time()
        from asp_npu.device import rollout_env
        from asp_npu.rollout.engine import EngineSettings, LoopThread, SamplingSettings
        from asp_npu.rollout.vllm_engine import VLLMEngine
        from asp_npu.types import PromptItem

        env = rollout_env("cpu", [0], 1)
        if executor == "mp":
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        loop = LoopThread()
        t_imp = time.time()

        async def build() -> VLLMEngine:
            return VLLMEngine(EngineSettings(model_path=model, max_num_seqs=64, max_model_len=512), env)

        eng = loop.run(build())
        t_built = time.time()
        sampling = SamplingSettings(n=1, max_tokens=128, ignore_eos=True, seed=0)

        async def batch(k: int) -> None:
            import asyncio

            items = [PromptItem(prompt_id=f"p{k}-{i}", text=f"What is {i}+{i}?") for i in range(64)]
            await asyncio.gather(*(eng.generate(it, sampling) for it in items))

        loop.run(batch(0))
        t_first = time.time()
        loop.run(batch(1))
        t_second = time.time()
        eng.shutdown()
        loop.close()
        return {"imports_s": t_imp - t0, "build_s": t_built - t_imp, "first_batch_s": t_first - t_built,
                "tokens_per_s": 64 * 128 / (t_second - t_first)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    import ray

    init_ray(2)
    rows: dict[str, list[dict[str, float]]] = {"mp": [], "uni": []}
    try:
        for _ in range(args.repeats):
            for executor in rows:
                actor = ray.remote(num_cpus=1)(Starter).remote()
                rows[executor].append(ray.get(actor.run.remote(args.model, executor), timeout=900))
                ray.kill(actor)
    finally:
        ray.shutdown()
    print("| executor | imports s | build s | first batch s | tokens/s | starts |")
    print("|---|---|---|---|---|---|")
    for executor, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"| {executor} | {med['imports_s']:.1f} | {med['build_s']:.1f} | {med['first_batch_s']:.1f} | "
              f"{med['tokens_per_s']:,.0f} | {len(rs)} |")


if __name__ == "__main__":
    main()
