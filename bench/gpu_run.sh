#!/usr/bin/env bash
# One stage of the GPU runner per device call (bench/gpu_run.py says what each does); results under $OUT:
#   bash bench/gpu_run.sh setup+tests | bench-a | bench-b
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
exec "$PY" bench/gpu_run.py "$@" --python "$PY"
