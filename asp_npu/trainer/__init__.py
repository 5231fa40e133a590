"""Megatron-core trainer: model, GRPO losses, HF<->Megatron weights, checkpoints."""
