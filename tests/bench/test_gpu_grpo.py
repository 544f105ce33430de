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


def test_smoke_cpu_tiny(tmp_path, monkeypatch, capsys):
    """``--device cpu --tiny``: TRL alone and slimrl each run a GRPO step in their own process on random
    completions of exactly the asked length; Liger and QLoRA say why they are skipped; ``--fit`` probes."""
    monkeypatch.setattr(sys, "argv", ["gpu_grpo.py"])
    gpu_grpo = _bench("gpu_grpo")
    common = ["--device", "cpu", "--tiny", "--generations", "2", "--steps", "1", "--cache", str(tmp_path)]
    res = gpu_grpo.main(common + ["--sides", "trl,trl-liger,slimrl", "--length", "12"])
    for side in ("trl", "slimrl"):
        assert res[side]["completion_len"] == 12 and res[side]["peak_gb"] > 0.1, res[side]
        assert math.isfinite(res[side]["loss"]) and res[side]["grad_norm"] > 0  # advantages are not all 0
    assert "liger-kernel" in res["trl-liger"]["skipped"]
    fit = gpu_grpo.main(common + ["--sides", "slimrl", "--fit", "--cap-gb", "0.1", "--fit-range", "16:16",
                                  "--fit-step", "16"])
    probe = fit["slimrl"]["probes"][16]
    assert fit["slimrl"]["longest_fit"] is None and probe["fits"] is False and probe["peak_gb"] > 0.1
    out = capsys.readouterr().out
    assert "trl-liger  skipped" in out and "longest completion that fits: None" in out


def test_logprob_bench_cpu_tiny(monkeypatch, capsys):
    """``bench/gpu_logprob.py --device cpu --tiny``: every pass timed for both kernels, a decision per row."""
    monkeypatch.syspath_prepend(str(BENCH))
    gpu_logprob = _bench("gpu_logprob")
    res = gpu_logprob.main(["--device", "cpu", "--tiny", "--repeats", "1"])
    assert set(res["passes"]) == {"policy (grad)", "old/ref (no grad)"}
    assert set(res["passes"]["old/ref (no grad)"]) == {"trl", "slimrl same outputs", "slimrl as used"}
    assert all(t > 0 for cases in res["passes"].values() for t, _ in cases.values())
    assert capsys.readouterr().out.count("x TRL ->") == 3
