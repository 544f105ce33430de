"""Several processes, each with its engine (TRL's colocate mode's shape): two ranks started by torchrun (CPU, gloo),
each loads the model with ``fast_inference=True`` and generates through its own engine, which joined the process
group already there (vLLM's ``external_launcher``) with its own sampling seed. On a GPU each rank's engine is on its
own device (``LOCAL_RANK``; tests/compat/test_gpus.py presents that)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slimrl.generation import vllm_status

pytestmark = [
    pytest.mark.skipif(vllm_status() is not None, reason=f"vLLM not usable here: {vllm_status()}"),
    pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU/gloo variant"),
]
ROOT = Path(__file__).resolve().parents[2]


def test_each_rank_runs_its_own_engine_in_the_process_group(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29531",
        str(ROOT / "tests/vllm/engine_rank_worker.py"),
        str(tmp_path),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    ranks = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert len(ranks) == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world_size"] == 2 for r in ranks)
    assert all(r["backend"] == "external_launcher" for r in ranks), ranks
    assert ranks[0]["seed"] != ranks[1]["seed"] and ranks[0]["tokens"] != ranks[1]["tokens"]
    assert all(len(t) == 6 for r in ranks for t in r["tokens"]) and all(r["shared_bytes"] > 0 for r in ranks)
