#!/usr/bin/env bash
# Start the Ray head on this Ascend node and wait until NNODES nodes have joined.
#   NNODES=2 NPUS_PER_NODE=8 bash launch/ray_head.sh
# Then run launch/ray_worker.sh (MASTER_ADDR=<this node's IP>) on every other node.
# Environment and overrides: launch/env_npu.sh. DRY_RUN=1 prints the commands instead.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/env_npu.sh"

setup_npu_env
: "${MASTER_ADDR:=$NODE_IP}"
[ "$MASTER_ADDR" = "$NODE_IP" ] || die "MASTER_ADDR=$MASTER_ADDR is not this node ($NODE_IP): run ray_head.sh on the head node, ray_worker.sh elsewhere"
LOG=$LOG_DIR/ray_head_$(hostname -s).log

run ray stop --force
run_logged "$LOG" ray start --head --port="$RAY_PORT" --node-ip-address="$NODE_IP" \
  --dashboard-host=0.0.0.0 --dashboard-port="$DASHBOARD_PORT" --resources="$(ray_resources)" \
  || die "ray start --head failed; see $LOG"
wait_for_nodes "$NODE_IP:$RAY_PORT"
[ "$DRY_RUN" = "1" ] || ray status --address="$NODE_IP:$RAY_PORT" | tee -a "$LOG"
