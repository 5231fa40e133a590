#!/usr/bin/env bash
# Shared environment for the Ascend cluster scripts (ray_head.sh, ray_worker.sh, train_npu.sh).
# Sourced, not run. Every variable below can be overridden from the caller's environment:
#   NNODES=2 NPUS_PER_NODE=8 MASTER_ADDR=10.0.0.1 SOCKET_IFNAME=enp189s0f0 bash launch/train_npu.sh CFG
# DRY_RUN=1 prints the exact commands (with the environment they get) instead of running them.
# Values follow MindSpeed-RL practice (configs/envs/runtime_env.yaml, examples/grpo/*.sh).

# ---- cluster shape and addresses
: "${NNODES:=1}"                       # nodes expected in the Ray cluster (head included)
: "${NPUS_PER_NODE:=8}"                # Atlas 800T A2: 8; Atlas 800T A3: 16
: "${RAY_PORT:=6766}"
: "${DASHBOARD_PORT:=8260}"
: "${JOIN_TIMEOUT:=900}"               # seconds to wait for NNODES nodes (head) / for the head (worker)
: "${POLL_INTERVAL:=5}"
: "${LOG_DIR:=logs}"
: "${DRY_RUN:=0}"
: "${ASP:=asp-npu}"                    # the asp-npu command on every node (same path everywhere)

# ---- CANN (the Ascend toolkit); nnal/atb is needed by vllm-ascend
: "${ASCEND_HOME:=/usr/local/Ascend}"
: "${CANN_SET_ENV:=$ASCEND_HOME/ascend-toolkit/set_env.sh}"
: "${ATB_SET_ENV:=$ASCEND_HOME/nnal/atb/set_env.sh}"

# ---- HCCL / runtime (MindSpeed-RL runtime_env.yaml values)
: "${HCCL_CONNECT_TIMEOUT:=1800}"
: "${HCCL_EXEC_TIMEOUT:=3600}"
: "${HCCL_IF_BASE_PORT:=48000}"
: "${HCCL_BUFFSIZE:=256}"
: "${PYTORCH_NPU_ALLOC_CONF:=expandable_segments:True}"
: "${TASK_QUEUE_ENABLE:=2}"
: "${CPU_AFFINITY_CONF:=1}"
: "${RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES:=1}"  # our actors set ASCEND_RT_VISIBLE_DEVICES themselves
: "${VLLM_USE_V1:=1}"
: "${VLLM_ASCEND_ENABLE_NZ:=0}"         # vllm-ascend RL guide: the FRACTAL_NZ weight layout breaks repeated
#                                         weight reloads (every refresh); RL runs need ND weights (0)
: "${CUDA_DEVICE_MAX_CONNECTIONS:=1}"
: "${RAY_DEDUP_LOGS:=0}"
: "${JEMALLOC:=}"                      # e.g. /usr/lib/aarch64-linux-gnu/libjemalloc.so.2 (LD_PRELOADed when set)

die() {
  echo "$(basename "$0"): error: $*" >&2
  exit 1
}

# A command line as it would be typed: safe words bare, anything else single-quoted.
quote_args() {
  local out="" a q="'"
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
      out+="$a "
    else
      out+="$q${a//$q/$q\\$q$q}$q "
    fi
  done
  echo "${out% }"
}

# Print the command (DRY_RUN=1) or run it.
run() {
  if [ "$DRY_RUN" = "1" ]; then
    quote_args "$@"
    return 0
  fi
  "$@"
}

# Like run, appending stdout+stderr to a log file.
run_logged() {
  local log=$1
  shift
  if [ "$DRY_RUN" = "1" ]; then
    echo "$(quote_args "$@") >> $(quote_args "$log") 2>&1"
    return 0
  fi
  "$@" >>"$log" 2>&1
}

# The interface and IPv4 address of the default route (what HCCL/gloo should bind to).
detect_ifname() {
  ip -o -4 route show to default 2>/dev/null | awk '{print $5; exit}'
}

detect_ip() {
  local ifname=$1 addr=""
  if [ -n "$ifname" ]; then
    addr=$(ip -4 -o addr show dev "$ifname" 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')
  fi
  [ -n "$addr" ] || addr=$(hostname -I 2>/dev/null | awk '{print $1}')
  echo "$addr"
}

: "${SOCKET_IFNAME:=$(detect_ifname)}"
: "${NODE_IP:=$(detect_ip "$SOCKET_IFNAME")}"
: "${HCCL_SOCKET_IFNAME:=$SOCKET_IFNAME}"
: "${GLOO_SOCKET_IFNAME:=$SOCKET_IFNAME}"
: "${TP_SOCKET_IFNAME:=$SOCKET_IFNAME}"

EXPORTED_VARS=(HCCL_CONNECT_TIMEOUT HCCL_EXEC_TIMEOUT HCCL_IF_BASE_PORT HCCL_BUFFSIZE HCCL_SOCKET_IFNAME
  GLOO_SOCKET_IFNAME TP_SOCKET_IFNAME PYTORCH_NPU_ALLOC_CONF TASK_QUEUE_ENABLE CPU_AFFINITY_CONF
  RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES VLLM_USE_V1 VLLM_ASCEND_ENABLE_NZ CUDA_DEVICE_MAX_CONNECTIONS
  RAY_DEDUP_LOGS)

# Source CANN (and ATB when present), check the driver, export the runtime environment.
setup_npu_env() {
  local var
  [ "$NNODES" -ge 1 ] 2>/dev/null || die "NNODES must be a positive integer (got '$NNODES')"
  [ "$NPUS_PER_NODE" -ge 1 ] 2>/dev/null || die "NPUS_PER_NODE must be a positive integer (got '$NPUS_PER_NODE')"
  [ "$VLLM_ASCEND_ENABLE_NZ" = "0" ] || die "VLLM_ASCEND_ENABLE_NZ=$VLLM_ASCEND_ENABLE_NZ: the FRACTAL_NZ weight layout breaks repeated weight refreshes; RL runs need VLLM_ASCEND_ENABLE_NZ=0 (unset it)"
  [ -n "$SOCKET_IFNAME" ] || die "cannot find the network interface of the default route: set SOCKET_IFNAME"
  [ -n "$NODE_IP" ] || die "cannot find this node's IPv4 address on '$SOCKET_IFNAME': set NODE_IP"
  if [ "$DRY_RUN" = "1" ]; then
    echo "source $CANN_SET_ENV"
    echo "source $ATB_SET_ENV  # when present"
  else
    [ -f "$CANN_SET_ENV" ] || die "CANN not found: $CANN_SET_ENV does not exist. Install the CANN toolkit (see docs/ascend.md) or set CANN_SET_ENV / ASCEND_HOME"
    # shellcheck disable=SC1090
    source "$CANN_SET_ENV" || die "sourcing $CANN_SET_ENV failed"
    if [ -f "$ATB_SET_ENV" ]; then
      # shellcheck disable=SC1090
      source "$ATB_SET_ENV" || die "sourcing $ATB_SET_ENV failed"
    fi
    command -v npu-smi >/dev/null || die "npu-smi not found: the Ascend driver is not installed on $(hostname)"
  fi
  for var in "${EXPORTED_VARS[@]}"; do
    export "${var?}"
    [ "$DRY_RUN" = "1" ] && echo "export $var=${!var}"
  done
  if [ -n "$JEMALLOC" ]; then
    [ "$DRY_RUN" = "1" ] || [ -f "$JEMALLOC" ] || die "JEMALLOC=$JEMALLOC does not exist"
    export LD_PRELOAD="$JEMALLOC${LD_PRELOAD:+:$LD_PRELOAD}"
    [ "$DRY_RUN" = "1" ] && echo "export LD_PRELOAD=$LD_PRELOAD"
  fi
  run mkdir -p "$LOG_DIR"
  [ "$DRY_RUN" = "1" ] && echo
  return 0
}

ray_resources() {
  printf '{"NPU": %s}' "$NPUS_PER_NODE"
}

# Total NPU resources the Ray cluster at $1 reports ("0.0/16.0 NPU" in `ray status`), as an integer.
cluster_npus() {
  ray status --address="$1" 2>/dev/null | awk '/[0-9.]+\/[0-9.]+ NPU/ {split($1, a, "/"); print int(a[2]); exit}'
}

# Block until NNODES x NPUS_PER_NODE NPUs have joined, or fail after JOIN_TIMEOUT seconds.
wait_for_nodes() {
  local address=$1 waited=0 npus nodes
  local want=$((NNODES * NPUS_PER_NODE))
  if [ "$DRY_RUN" = "1" ]; then
    echo "# poll every ${POLL_INTERVAL}s, up to ${JOIN_TIMEOUT}s, until $want NPUs ($NNODES nodes) have joined:"
    run ray status --address="$address"
    return 0
  fi
  while :; do
    npus=$(cluster_npus "$address")
    npus=${npus:-0}
    nodes=$((npus / NPUS_PER_NODE))
    if [ "$npus" -ge "$want" ]; then
      echo "Ray cluster ready: $nodes node(s), $npus NPUs"
      return 0
    fi
    if [ "$waited" -ge "$JOIN_TIMEOUT" ]; then
      die "only $nodes of $NNODES node(s) joined ($npus of $want NPUs) after ${JOIN_TIMEOUT}s: start launch/ray_worker.sh with MASTER_ADDR=$address on the missing nodes and read their $LOG_DIR/ray_worker_*.log"
    fi
    echo "waiting for nodes: $nodes of $NNODES joined ($npus of $want NPUs), ${waited}s"
    sleep "$POLL_INTERVAL"
    waited=$((waited + POLL_INTERVAL))
  done
}
