"""``slimrl plan`` with ``fast_inference`` on CPU: the engine's runtime measured once (a 2-layer model of the planned
shape, random weights, slimrl's engine started on it) and cached (:mod:`slimrl.planning.engine_cpu`)."""

from __future__ import annotations

import pytest
import torch

from slimrl.generation import vllm_status

pytestmark = pytest.mark.skipif(vllm_status() is not None, reason=f"vLLM not usable here: {vllm_status()}")


def test_engine_runtime_is_measured_once_and_cached(tmp_path, monkeypatch):
    from slimrl.planning import Settings, engine_cpu, plan
    from slimrl.planning.config import load_config

    monkeypatch.setenv("SLIMRL_CACHE", str(tmp_path))
    config = load_config("SmolLM2-135M-Instruct")
    runtime, how = engine_cpu.runtime_bytes(config, 16, torch.float32)
    # What vLLM's CPU build keeps resident depends on the machine's ISA (its GEMM dispatch: oneDNN, sgl, zentorch):
    # 518 MB on this workplace's AVX2 EPYC, 48 MB on the CI runner. So only: measured, positive, under 2 GiB.
    assert how == "measured" and 0 < runtime < 2 * 2**30, runtime
    cached = list(tmp_path.glob("engine-runtime-v1-cpu-*.json"))
    assert len(cached) == 1
    cached[0].write_text('{"runtime_bytes": 7}')  # the second call reads the cache, never measures again
    assert engine_cpu.runtime_bytes(config, 16, torch.float32) == (7, "measured")
    p = plan(
        config,
        Settings(
            per_device_train_batch_size=8,
            num_generations=8,
            max_prompt_length=39,
            max_completion_length=256,
            lora_r=16,
            fast_inference=True,
            device="cpu",
        ),
        search=False,
    )
    assert p.phases["engine"] == engine_cpu.computed_bytes(config, 16, torch.float32) + 7 and not p.notes
