"""Rollout instances: engine protocol, vLLM engine, instance actor, weight refresh, engine calibration."""
