#!/usr/bin/env bash
# The README's main command on a CPU machine: set up if needed, then train.
# Builds the tiny Qwen2 model locally (no download), warm-starts it with SFT on the synthetic
# `count` task, then runs GRPO with the ASP asynchronous pipeline: two vLLM instances sharing the
# cores with one megatron-core trainer rank (gloo), bounded policy lag. Extra arguments are config
# overrides, e.g. `bash launch/run_cpu.sh trainer.train_iters=4 rl_config.max_lag=2`, or
# `generate_config.num_instances=1` for the disaggregated layout (instance on core 0, trainer on core 1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
export TORCH_DEVICE_BACKEND_AUTOLOAD=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 VLLM_HOST_IP=127.0.0.1 \
       MASTER_ADDR=127.0.0.1 GLOO_SOCKET_IFNAME=lo RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false \
       PYTHONWARNINGS=ignore
OUT=${OUT:-runs/cpu_demo}
exec .venv/bin/asp-npu train --config "${CONFIG:-configs/cpu_tiny.yaml}" trainer.run_dir="$OUT" "$@"
