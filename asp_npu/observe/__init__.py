"""Metrics, bubble accounting, Perfetto timelines, plots and run reports."""
