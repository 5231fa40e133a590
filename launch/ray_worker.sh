#!/usr/bin/env bash
# Join this Ascend node to the Ray cluster whose head runs at MASTER_ADDR:RAY_PORT.
#   MASTER_ADDR=10.0.0.1 NPUS_PER_NODE=8 bash launch/ray_worker.sh
# Retries until the head answers (JOIN_TIMEOUT seconds). BLOCK=1 keeps the script in the
# foreground (`ray start --block`) for schedulers that need a live process per node.
# Environment and overrides: launch/env_npu.sh. DRY_RUN=1 prints the commands instead.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/env_npu.sh"
: "${BLOCK:=0}"

[ -n "${MASTER_ADDR:-}" ] || die "MASTER_ADDR is not set: export the head node's IP (the one ray_head.sh printed)"
setup_npu_env
LOG=$LOG_DIR/ray_worker_$(hostname -s).log
args=(ray start --address="$MASTER_ADDR:$RAY_PORT" --node-ip-address="$NODE_IP" --resources="$(ray_resources)")
[ "$BLOCK" = "1" ] && args+=(--block)

run ray stop --force
if [ "$DRY_RUN" = "1" ]; then
  echo "# retry every ${POLL_INTERVAL}s, up to ${JOIN_TIMEOUT}s, until the head at $MASTER_ADDR:$RAY_PORT answers:"
  run_logged "$LOG" "${args[@]}"
  exit 0
fi
waited=0
until run_logged "$LOG" "${args[@]}"; do
  if [ "$waited" -ge "$JOIN_TIMEOUT" ]; then
    die "cannot join the Ray head at $MASTER_ADDR:$RAY_PORT after ${JOIN_TIMEOUT}s (is ray_head.sh running there? firewall?); see $LOG"
  fi
  echo "head $MASTER_ADDR:$RAY_PORT not reachable yet, retrying in ${POLL_INTERVAL}s"
  sleep "$POLL_INTERVAL"
  waited=$((waited + POLL_INTERVAL))
done
echo "joined the Ray cluster at $MASTER_ADDR:$RAY_PORT with $NPUS_PER_NODE NPUs; log: $LOG"
