#!/usr/bin/env bash
# Install slimrl's carry set (`make gpu-wheels` put it in .gpu-wheels/slimrl/) on the lent GPU machine (no package
# registry there); Unsloth's set goes to a folder of its own (bench/gpu_unsloth.py, command B):
#   bash bench/gpu_setup.sh && python3 bench/gpu_grpo.py --help
# --no-deps: that machine's torch, transformers, peft, accelerate, pyarrow stay as they are (its transformers is
# 5.17, which `make test-full` runs TRL 1.16 and slimrl on). The import check below names any module still missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
$PY -m pip install -q --no-index --no-deps --no-compile --find-links .gpu-wheels/slimrl .gpu-wheels/slimrl/*.whl
$PY - <<'PY'
import importlib
import sys

missing = []
for name in ("trl", "datasets", "liger_kernel", "bitsandbytes", "slimrl", "peft", "accelerate"):
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - report every failure, not only ImportError
        missing.append(f"{name}: {type(exc).__name__}: {exc}")
import torch
import transformers

print(f"torch {torch.__version__} cuda={torch.cuda.is_available()} transformers {transformers.__version__}")
if missing:
    sys.exit("cannot import:\n  " + "\n  ".join(missing))
print("GPU machine ready for slimrl's sides")
PY
