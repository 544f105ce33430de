"""The engine's memory arguments on a GPU and the one line that says what to change (slimrl/compat/engine_memory.py);
vLLM's own check is the oracle in tests/vllm/test_gpu_start.py, this is the rule stated where vLLM is not installed."""

from __future__ import annotations

from slimrl.compat.engine_memory import ENGINE_RESERVE, GiB, cuda_engine_start, fix_for, startup_problem


def test_a_float_is_the_engines_share_with_its_weights_and_auto_is_what_it_needs():
    start = cuda_engine_start(0.9, free=70 * GiB, total=80 * GiB, external=8 * GiB)
    assert start.gpu_memory_utilization == 0.9 and start.kv_cache_memory_bytes is None
    assert startup_problem(start) is None  # 72 - 8 = 64 GiB needed, 70 free
    auto = cuda_engine_start("auto", free=70 * GiB, total=80 * GiB, external=8 * GiB, kv_bytes=10 * GiB)
    assert auto.kv_cache_memory_bytes == 10 * GiB
    assert auto.gpu_memory_utilization * 80 * GiB >= 18 * GiB + ENGINE_RESERVE and startup_problem(auto) is None


def test_the_fix_names_what_to_change():
    short = cuda_engine_start(0.9, free=20 * GiB, total=80 * GiB, external=8 * GiB)
    assert startup_problem(short) and "lower gpu_memory_utilization to 0.35 or below" in fix_for(short)
    small = cuda_engine_start(0.1, free=60 * GiB, total=80 * GiB, external=16 * GiB)
    assert startup_problem(small) and "raise gpu_memory_utilization to at least 0.21" in fix_for(small)
    huge = cuda_engine_start(0.5, free=-GiB, total=15 * GiB, external=16 * GiB)
    assert startup_problem(huge) and "load_in_4bit=True" in fix_for(huge)
