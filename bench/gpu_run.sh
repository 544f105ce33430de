#!/usr/bin/env bash
# The GPU runner, one command per device call (bench/gpu_run.py says what each does); results under $OUT:
#   bash bench/gpu_run.sh A     # then, within the 30-second warm window if 5 minutes of the lease remain:
#   bash bench/gpu_run.sh B
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
exec "$PY" bench/gpu_run.py "$@" --python "$PY"
