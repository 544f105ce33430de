"""The GPU runner rehearsed on this CPU (``bench/gpu_run.py all --device cpu --tiny``): both commands run the same
scripts and flags the GPU machine will, inside the rehearsal's 4 minutes; their results fit what one device call
brings back (at most 8 files of at most 16 MiB) and ``bench/gpu_report.py`` turns them into BENCHMARKS rows with
the targets marked. Unsloth is installed from its carry set for Python 3.12 (the machine's) and imported, with
``PatchFastRL``, from the same set through a view of the GPU machine's packages only (``make envs`` builds
``.venv-unsloth``): a module Unsloth needs that the machine lacks would fail here. A step over its limit is killed and
recorded, and the stage goes on; a stage short of time skips what it cannot finish."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
UNSLOTH = ROOT / ".venv-unsloth"


def _bench(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# Not marked slow: the issue asks make test to rehearse both commands (about 3 minutes here).
def test_both_commands_rehearsed_fit_what_comes_back(tmp_path, capsys, monkeypatch):
    if not (UNSLOTH / ".installed").exists() or not (ROOT / ".gpu-wheels" / "unsloth").is_dir():
        pytest.skip("make envs builds .gpu-wheels and .venv-unsloth (the rehearsal's Unsloth)")
    monkeypatch.setenv("SLIMRL_UNSLOTH_SITE", str(UNSLOTH / "site"))
    monkeypatch.setenv("SLIMRL_UNSLOTH_VIEW", str(UNSLOTH / "machine"))
    gpu_run, gpu_report = _bench("gpu_run"), _bench("gpu_report")
    out = tmp_path / "out"
    assert gpu_run.main(["all", "--device", "cpu", "--tiny", "--out", str(out)]) == 0, capsys.readouterr().out
    files = sorted(out.iterdir())
    assert [f.name for f in files] == ["A.json", "A.log", "B.json", "B.log"]
    assert len(files) <= gpu_run.MAX_FILES and all(f.stat().st_size <= gpu_run.MAX_FILE_BYTES for f in files)
    reports = {s: json.loads((out / f"{s}.json").read_text()) for s in gpu_run.STAGES}
    for stage, report in reports.items():
        assert report["setup"] == "already installed" and report["versions"]["device"] == "cpu"
        assert [s["name"] for s in report["steps"]] == [s.name for s in gpu_run.steps(stage, tiny=True)]
        assert all(s["rc"] == 0 and not s["timed_out"] for s in report["steps"]), report["steps"]
    a = {s["name"]: s.get("result") for s in reports["A"]["steps"]}
    b = {s["name"]: s.get("result") for s in reports["B"]["steps"]}
    for side in ("trl", "slimrl"):  # each side its own process, completions of exactly the asked length
        r = a["headline"][side]
        assert r["completion_len"] == 12 and r["peak_gb"] > 0.1 and len(r["step_s"]) == 2, r
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0  # advantages are not all 0
    assert "liger-kernel" in a["headline"]["trl-liger"]["skipped"]  # not installed here: said, not failed
    assert a["headline"]["plan"]["peak_gb"] > 0  # slimrl plan's prediction beside the measurement
    assert b["unsloth-setup"]["ok"] and "unsloth" in b["unsloth-setup"]["installed"]
    unsloth = b["unsloth-headline"]["unsloth"]  # imported and patched TRL 1.15 through the machine view
    assert unsloth["rehearsed"] and unsloth["versions"]["unsloth"] == "2026.10.9", unsloth
    assert unsloth["versions"]["trl"] == "1.15.0" and unsloth["versions"]["transformers"] == "5.17.0"
    fit = b["fit-24gb"]
    for side in ("trl", "slimrl"):  # two measured lengths, a fitted one, its probe
        assert set(fit[side]["points_gb"]) == {"8", "16"} and fit[side]["confirmed"], fit[side]
        assert fit[side]["longest_fit"] == fit[side]["predicted"] == 32
    for side in ("slimrl/noshared", "slimrl/resident", "slimrl/untiled"):  # the attribution: each default off
        assert math.isfinite(b["attribution"][side]["loss"]), b["attribution"][side]
    capsys.readouterr()
    assert gpu_report.main([str(out)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| device | step |")
    assert any("A / headline | slimrl |" in row and "x memory" in row and " GB, " in row for row in table)
    assert any("A / parity-4bit | | passed" in row for row in table)
    assert any("B / fit-24gb | slimrl |" in row and "1.00x length" in row for row in table)
    assert any(row.startswith("- CUDA correctness") and "met" in row for row in table)
    assert not any("no result" in row or "not run" in row for row in table)


def test_a_step_over_its_limit_is_killed_and_the_stage_goes_on(tmp_path, monkeypatch):
    gpu_run = _bench("gpu_run")
    slow = gpu_run.Step("slow", (sys.executable, "-c", "import time; time.sleep(30)"), 1, 1, 1)
    quick = gpu_run.Step("quick", (sys.executable, "-c", "print('BENCH_RESULT {\"x\": 1}')"), 10, 1, 10)
    monkeypatch.setattr(gpu_run, "steps", lambda stage, tiny: [slow, quick])
    report = gpu_run.run_stage("A", tmp_path, sys.executable, tiny=True)
    first, second = report["steps"]
    assert first["timed_out"] and first["rc"] is None and first["seconds"] < 10
    assert second["rc"] == 0 and second["result"] == {"x": 1}
    assert json.loads((tmp_path / "A.json").read_text())["steps"][1]["result"] == {"x": 1}
    gpu_report = _bench("gpu_report")
    assert "timed out, no result" in gpu_report.rows(report)[0]


def test_a_stage_short_of_time_skips_what_it_cannot_finish(tmp_path, monkeypatch):
    """On the GPU a step is started only with its ``min_s`` left of the stage's budget, and runs at most the time
    left: the command ends inside its budget and says what it skipped."""
    gpu_run = _bench("gpu_run")
    long = gpu_run.Step("long", (sys.executable, "-c", "import time; time.sleep(3)"), 60, 1)
    late = gpu_run.Step("late", (sys.executable, "-c", "print(1)"), 60, 100)
    monkeypatch.setattr(gpu_run, "steps", lambda stage, tiny: [long, late])
    monkeypatch.setitem(gpu_run.BUDGET_S, "B", 50)
    monkeypatch.setattr(gpu_run, "probe", lambda py: {"missing": [], "device": "cpu"})
    report = gpu_run.run_stage("B", tmp_path, sys.executable, tiny=False)
    first, second = report["steps"]
    assert first["rc"] == 0 and first["limit_s"] <= 50
    assert "the step needs 100" in second["skipped"]


def test_the_runner_runs_tests_gpu_budgets_every_step_and_keeps_bitsandbytes_for_any_torch_cuda():
    """What the runner must do on a real GPU, checked on its tables: every CUDA test runs (tests/gpu, not one file);
    a stage's step limits fit its budget, so the last steps (the 24 GB fit, the 8B QLoRA row) get their share;
    bitsandbytes keeps a build for every CUDA PyTorch publishes wheels for, and a 4-bit step says in one line why it
    is skipped where bitsandbytes has none for the machine's."""
    gpu_run, gpu_wheels = _bench("gpu_run"), _bench("gpu_wheels")
    a = gpu_run.steps("A", tiny=False)
    assert any(s.argv[-1] == "tests/gpu" for s in a)
    for stage in gpu_run.STAGES:
        assert sum(s.limit_s for s in gpu_run.steps(stage, tiny=False)) <= gpu_run.BUDGET_S[stage], stage
    dropped = gpu_wheels.STRIP["bitsandbytes-"][0]
    kept = [b for b in gpu_wheels.TORCH_CUDA_BUILDS if not any(f"cuda{b}" in d for d in dropped)]
    assert kept == list(gpu_wheels.TORCH_CUDA_BUILDS) and len({b[:2] for b in kept}) >= 2  # CUDA 12 and 13
    four_bit = next(s for s in a if s.needs_4bit)
    missing = {"bnb": "bitsandbytes has no build for CUDA 12.4"}
    why = gpu_run.skip_reason(four_bit, missing, 400, tiny=False, budget=420)
    assert why and "\n" not in why and "CUDA 12.4" in why
    assert gpu_run.skip_reason(four_bit, {"bnb": None}, 400, tiny=False, budget=420) is None
    assert gpu_run.skip_reason(a[-1], missing, 400, tiny=False, budget=420) is None  # only 4-bit steps need it
    assert "needs 120" in gpu_run.skip_reason(a[-1], {}, 30, tiny=False, budget=420)
