#!/usr/bin/env bash
# Build what configs/cpu_bench.yaml needs, then (with --bench) run the benchmark. Idempotent: a model
# folder that is already complete is kept, a half-written one (*.partial) is rebuilt.
#   bash launch/build_bench_model.sh            # models/tiny -> models/tiny-sft -> models/tiny-long
#   bash launch/build_bench_model.sh --bench [SEEDS] [OUT.json]   # then bench real, 3 modes
# Stage 1: `asp-npu sft` of the locally built 4-layer tiny model on the `count` task (answers <= 16
# items, 2,500 steps). Stage 2: continued SFT on answers of up to 64 items (1,200 steps), so sampled
# answers follow the prompts' long-tailed lengths (mean ~65, p90 = max_tokens 192).
set -euo pipefail
cd "$(dirname "$0")/.."
export TORCH_DEVICE_BACKEND_AUTOLOAD=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 VLLM_HOST_IP=127.0.0.1 \
       MASTER_ADDR=127.0.0.1 GLOO_SOCKET_IFNAME=lo RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false \
       PYTHONWARNINGS=ignore
[ -x .venv/bin/python ] || bash ci/setup.sh
CONFIG=configs/cpu_bench.yaml
mkdir -p models runs
ASP=(.venv/bin/python -m asp_npu.cli)

complete() {  # an HF folder with config, tokenizer and weights
  [ -f "$1/config.json" ] && [ -f "$1/tokenizer.json" ] && compgen -G "$1/*.safetensors" >/dev/null
}

sft() {  # sft OUT FROM [overrides...]: written to OUT.partial, renamed when the stage has finished
  local out=$1 from=$2; shift 2
  if complete "$out"; then echo "build_bench_model: $out is complete, kept"; return; fi
  rm -rf "$out" "$out.partial"
  "${ASP[@]}" sft --config "$CONFIG" --out "$out.partial" model.path="$from" model.build_if_missing=true \
    actor_config.num_threads=1 sft.eval_every=0 sft.eval_prompts=32 "$@"
  mv "$out.partial" "$out"
}

sft models/tiny-sft models/tiny sft.steps=2500 sft.lr=2e-3 sft.max_items=16
sft models/tiny-long models/tiny-sft sft.steps=1200 sft.lr=1e-3 sft.max_items=64 \
  generate_config.sampling_config.max_tokens=320

if [ "${1:-}" = "--bench" ]; then
  "${ASP[@]}" bench real --config "$CONFIG" --modes asp,async-fifo,mindspeed-sync \
    --seeds "${2:-1,2,3}" --out-dir runs/cpu_bench_modes --overwrite --json "${3:-runs/cpu_bench.json}"
fi
