#!/usr/bin/env bash
# The README's test command: set up if needed, lint, type-check, run the whole suite (or the tests
# the arguments select, e.g. `bash ci/test.sh -m "not slow"`: the fast loop).
# pytest exit code 5 (no tests collected) is a failure here, never a silent success.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
bash ci/setup.sh || { echo "ci/test.sh: setup failed" >&2; exit 1; }
PY=.venv/bin/python
export TORCH_DEVICE_BACKEND_AUTOLOAD=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 VLLM_HOST_IP=127.0.0.1 \
       MASTER_ADDR=127.0.0.1 GLOO_SOCKET_IFNAME=lo RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check asp_npu tests || { echo "ci/test.sh: ruff found problems" >&2; exit 1; }
$PY -m mypy || { echo "ci/test.sh: mypy found type errors (config: pyproject.toml [tool.mypy])" >&2; exit 1; }
# Two workers (ASP_NPU_TEST_WORKERS=0: one process): a real-engine test keeps ~55% of the 2 cores busy.
# One file per worker at a time, so a module's engines and Ray cluster stay in one process; xdist's
# own file order (most tests first). Longest files first was tried and measured slower (73 min vs 55
# here): the real-engine files then overlap each other (docs/BENCHMARKS.md, "CI time").
workers=${ASP_NPU_TEST_WORKERS:-2}
xdist=(); [ "$workers" -gt 0 ] && xdist=(-n "$workers" --dist loadfile)
$PY -m pytest -q -p no:cacheprovider --timeout=900 --durations=25 "${xdist[@]}" "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "ci/test.sh: pytest collected no tests -- failing" >&2
  exit 1
fi
exit $rc
