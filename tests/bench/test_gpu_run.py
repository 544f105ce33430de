"""The staged GPU runner rehearsed on this CPU (``bench/gpu_run.py all --device cpu --tiny``): every stage runs the
same scripts and flags the GPU machine will, its results fit what one device call brings back (at most 8 files of
at most 16 MiB), and ``bench/gpu_report.py`` turns them into BENCHMARKS rows. A step over its limit is killed and
recorded, and the stage goes on."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# Not marked slow: issue 34 asks make test to rehearse every stage (about 130 s here).
def test_every_stage_rehearsed_fits_what_comes_back(tmp_path, capsys):
    gpu_run, gpu_report = _bench("gpu_run"), _bench("gpu_report")
    out = tmp_path / "out"
    assert gpu_run.main(["all", "--device", "cpu", "--tiny", "--out", str(out)]) == 0, capsys.readouterr().out
    files = sorted(out.iterdir())
    assert [f.name for f in files] == sorted(f"{s}.{ext}" for s in gpu_run.STAGES for ext in ("json", "log"))
    assert len(files) <= gpu_run.MAX_FILES and all(f.stat().st_size <= gpu_run.MAX_FILE_BYTES for f in files)
    for stage in gpu_run.STAGES:
        report = json.loads((out / f"{stage}.json").read_text())
        assert report["setup"] == "already installed" and report["versions"]["device"] == "cpu"
        assert [s["name"] for s in report["steps"]] == [s.name for s in gpu_run.steps(stage, tiny=True)]
        assert all(s["rc"] == 0 and not s["timed_out"] for s in report["steps"]), report["steps"]
    fit, step, kernels = (s["result"] for s in json.loads((out / "bench-a.json").read_text())["steps"])
    assert fit["slimrl"]["longest_fit"] == 16  # the fit search ran: 16 tokens fit under 64 GB
    for side in ("trl", "slimrl"):  # each side its own process, completions of exactly the asked length
        assert step[side]["completion_len"] == 12 and step[side]["peak_gb"] > 0.1, step[side]
        assert math.isfinite(step[side]["loss"]) and step[side]["grad_norm"] > 0  # advantages are not all 0
    assert "liger-kernel" in step["trl-liger"]["skipped"]  # not installed here: said, not failed
    assert set(kernels["passes"]) == {"policy (grad)", "old/ref (no grad)"}
    assert set(kernels["passes"]["old/ref (no grad)"]) == {"trl", "slimrl same outputs", "slimrl as used"}
    assert all(t > 0 for cases in kernels["passes"].values() for t, _ in cases.values())
    capsys.readouterr()
    assert gpu_report.main([str(out)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| device | stage / step |")
    assert any("bench-a / step-time | slimrl |" in row and "x memory" in row for row in table)
    assert any("bench-b / offload | slimrl/resident |" in row for row in table)
    assert not any("no result" in row or "not run" in row for row in table)


def test_a_step_over_its_limit_is_killed_and_the_stage_goes_on(tmp_path, monkeypatch):
    gpu_run = _bench("gpu_run")
    slow = gpu_run.Step("slow", (sys.executable, "-c", "import time; time.sleep(30)"), 1, 1)
    quick = gpu_run.Step("quick", (sys.executable, "-c", "print('BENCH_RESULT {\"x\": 1}')"), 10, 10)
    monkeypatch.setattr(gpu_run, "steps", lambda stage, tiny: [slow, quick])
    report = gpu_run.run_stage("bench-a", tmp_path, sys.executable, tiny=True)
    first, second = report["steps"]
    assert first["timed_out"] and first["rc"] is None and first["seconds"] < 10
    assert second["rc"] == 0 and second["result"] == {"x": 1}
    gpu_report = _bench("gpu_report")
    assert "timed out, no result" in gpu_report.rows(report)[0]
