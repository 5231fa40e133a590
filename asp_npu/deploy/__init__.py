"""Cluster deployment: config checks for Ascend clusters, MindSpeed-RL config import."""
