"""``bench/gpu_grpo.py`` on this CPU: the bench itself works (its GPU figures come from a GPU machine, see
docs/BENCHMARKS.md); the longest-fit search finds the boundary."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("boundary", [None, 256, 700, 32768])
def test_longest_fitting_finds_the_boundary(boundary):
    gpu_grpo = _bench("gpu_grpo")
    probed: list[int] = []

    def fits(length: int) -> bool:
        probed.append(length)
        return boundary is not None and length <= boundary

    best = gpu_grpo.longest_fitting(fits, 256, 32768, 256)
    assert best == (None if boundary is None else boundary // 256 * 256)
    assert len(probed) <= math.ceil(math.log2(128)) + 1 and all(p % 256 == 0 for p in probed)


def test_a_probe_over_the_cap_does_not_fit(tmp_path, monkeypatch, capsys):
    """``--fit`` on this CPU: a probe whose peak RSS is over ``--cap-gb`` does not fit (the step-time runs and the
    kernel comparison are rehearsed by tests/bench/test_gpu_run.py)."""
    monkeypatch.setattr(sys, "argv", ["gpu_grpo.py"])
    gpu_grpo = _bench("gpu_grpo")
    common = ["--device", "cpu", "--tiny", "--generations", "2", "--steps", "1", "--cache", str(tmp_path)]
    fit = gpu_grpo.main(common + ["--sides", "slimrl", "--fit", "--cap-gb", "0.1", "--fit-range", "16:16",
                                  "--fit-step", "16"])
    probe = fit["slimrl"]["probes"][16]
    assert fit["slimrl"]["longest_fit"] is None and probe["fits"] is False and probe["peak_gb"] > 0.1
    assert "longest completion that fits: None" in capsys.readouterr().out
