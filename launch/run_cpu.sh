#!/usr/bin/env bash
# The README's main command on a CPU machine: set up if needed, then run the main job.
# Today the main job generates a synthetic reasoning-RL length trace and plans one epoch with the
# offline ASP planner on the configured instances; the training pipeline replaces it when it lands.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
export TORCH_DEVICE_BACKEND_AUTOLOAD=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 VLLM_HOST_IP=127.0.0.1 \
       MASTER_ADDR=127.0.0.1 GLOO_SOCKET_IFNAME=lo RAY_USAGE_STATS_ENABLED=0
OUT=${OUT:-runs/cpu_demo}
mkdir -p "$OUT"
ASP=.venv/bin/asp-npu
$ASP trace synth --prompts "${PROMPTS:-4096}" --epochs 3 --n 8 --seed 0 --out "$OUT/trace.jsonl"
$ASP plan --trace "$OUT/trace.jsonl" --epoch 2 --instances "${INSTANCES:-8}" --minibatch 256 \
  --predictor history --out "$OUT/plan.json" --json
echo "plan written to $OUT/plan.json"
