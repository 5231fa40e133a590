"""asp-npu: offline length-aware rollout scheduling and bounded-lag async RL on Ascend NPU."""

__version__ = "0.1.0"
