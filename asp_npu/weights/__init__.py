"""weight_refresh: the trainer's new weights reach every rollout instance, one version at a time.

The one seam from trainer to instances (`refresh.WeightSync`, driven by the controller):
    gather -> publish(version) -> refresh (every instance behind it) -> poll (who holds what, paused how long)
Two paths behind it, chosen by `generate_config.weight_transfer`:
- vLLM's weight-transfer engine (`auto`, default): trainer rank 0 broadcasts over one process group
  to every instance worker (`engine_link`: sender + instance client; `gloo_engine`: the CPU member of
  vLLM's engine family; HCCL/NCCL on NPU/CUDA);
- Ray's object store (`object-store`): HF safetensors bytes (`hf.HFWeights`), loaded in each worker by
  the `receiver` extension through vLLM's `reload_weights`.
`transport` holds the byte transports (bucketed broadcast, object store) and their stats;
`vllm_fixes` what a vLLM worker needs after a load (tied head, CPU MoE repack).
Imports: nothing above it (no pipeline, rollout or trainer); trainer, rollout and pipeline import it.
"""
