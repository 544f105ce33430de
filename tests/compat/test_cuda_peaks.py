"""slimrl never resets torch's CUDA peak counters (a notebook's "peak reserved memory" cell after ``train()`` reads
them); its own windows (a step's ``memory/peak_mb``, the engine's phases) are read from the counters as they move."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from slimrl.compat.memory import PeakWindow, peak_window
from slimrl.generation.engine import SlimrlEngine

GB = 2**30
CUDA = torch.device("cuda", 0)
SRC = Path(__file__).resolve().parents[2] / "slimrl"


def test_no_reset_in_the_library():
    """Only ``slimrl compare``'s workers (a process of their own, measuring one side) may reset the counters."""
    calls = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "reset_peak_memory_stats":
                calls.append(str(path.relative_to(SRC)))
    assert set(calls) <= {"cli/compare_worker.py"}, calls


def test_a_window_reads_the_counters_without_resetting(fake_gpu):
    gpu = fake_gpu("a100-80gb")
    gpu.place(10 * GB)
    gpu.release(9 * GB)  # the process peaked at 10 GB before the window
    with peak_window(CUDA) as window:
        gpu.place(2 * GB)
        assert window.peak_bytes() == 3 * GB  # below the earlier peak: what is allocated (a lower bound)
        gpu.place(12 * GB)
        gpu.release(13 * GB)
        assert window.peak_bytes() == 15 * GB  # the process's peak rose inside the window: exactly that
    assert gpu.resets == 0 and torch.cuda.max_memory_allocated() == 15 * GB


class _RecordingLLM:
    """vLLM's ``LLM`` methods the engine calls around a generation, recorded in order."""

    def __init__(self, gpu):
        self.gpu, self.calls = gpu, []

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def release_kv_cache_memory(self):
        self.calls.append(("release_kv_cache_memory",))
        self.gpu.release(4 * GB)

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))
        if tags == ["kv_cache"]:
            self.gpu.place(4 * GB)

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


def test_engine_phases_on_cuda(fake_gpu):
    gpu = fake_gpu("h100")
    engine = SlimrlEngine("unused", torch.bfloat16, 512, 16, 0.5)
    gpu.place(6 * GB)  # weights and KV cache
    engine.llm = _RecordingLLM(gpu)
    engine._phase = PeakWindow(CUDA)
    gpu.place(1 * GB)
    gpu.release(1 * GB)  # generation's activations
    assert engine.standby() == 4 * GB
    gpu.place(3 * GB)
    gpu.release(3 * GB)  # training
    engine.resume()
    assert engine.llm.calls == [
        ("sleep", 0),
        ("release_kv_cache_memory",),
        ("wake_up", ["kv_cache"]),
        ("wake_up", ["scheduling"]),
        ("reset_prefix_cache",),
    ]
    # generation rose to 7 GB; the training window opened with the KV cache still there (6 GB), then stayed below
    assert engine.phase_peaks == {"generation": 7 * GB, "training": 6 * GB}
    assert gpu.resets == 0
