#!/usr/bin/env bash
# Run asp-npu GRPO training on an Ascend Ray cluster, from the head node:
#   NNODES=2 NPUS_PER_NODE=8 bash launch/train_npu.sh configs/npu/qwen25_7b_a2_2node.yaml [key=value ...]
# Starts the Ray head (unless SKIP_RAY_START=1, e.g. when ray_head.sh already runs), waits for
# NNODES nodes (start launch/ray_worker.sh on the others), validates the config for this cluster
# with `asp-npu check`, then trains; the log goes to $LOG_DIR/train.log.
# Environment and overrides: launch/env_npu.sh. DRY_RUN=1 prints the commands instead.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${SKIP_RAY_START:=0}"

[ $# -ge 1 ] || { echo "usage: $(basename "$0") CONFIG.yaml [key=value ...]" >&2; exit 2; }
CONFIG=$1
shift
[ -f "$CONFIG" ] || { echo "$(basename "$0"): error: config $CONFIG not found" >&2; exit 2; }

if [ "$SKIP_RAY_START" = "1" ]; then
  source "$HERE/env_npu.sh"
  setup_npu_env
  : "${MASTER_ADDR:=$NODE_IP}"
  wait_for_nodes "$MASTER_ADDR:$RAY_PORT"
else
  source "$HERE/ray_head.sh"
fi
export RAY_ADDRESS="$MASTER_ADDR:$RAY_PORT"
[ "$DRY_RUN" = "1" ] && echo "export RAY_ADDRESS=$RAY_ADDRESS"

run "$ASP" check --config "$CONFIG" --nodes "$NNODES" --npus-per-node "$NPUS_PER_NODE" --no-sim "$@" \
  || die "asp-npu check refused $CONFIG for $NNODES node(s) x $NPUS_PER_NODE NPUs (problems above)"
overrides=(trainer.device=npu "trainer.nnodes=$NNODES" "trainer.n_devices_per_node=$NPUS_PER_NODE" "$@")
if [ "$DRY_RUN" = "1" ]; then
  echo "$(quote_args "$ASP" train --config "$CONFIG" "${overrides[@]}") 2>&1 | tee -a $(quote_args "$LOG_DIR/train.log")"
  exit 0
fi
"$ASP" train --config "$CONFIG" "${overrides[@]}" 2>&1 | tee -a "$LOG_DIR/train.log"
