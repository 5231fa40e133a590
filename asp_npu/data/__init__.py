"""Prompt datasets, synthetic verifiable tasks, reward functions and length traces."""
