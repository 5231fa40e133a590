"""Discrete-event simulator of the pipeline and its baselines, cost presets, calibration."""
