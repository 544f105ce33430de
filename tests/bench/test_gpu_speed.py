"""The lease script rehearsed on this CPU (``bench/gpu_speed.py --device cpu --tiny``): every section is written to
``speed.json`` with its figures beside the planner's predictions, and a section that cannot run here says why."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _speed():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("gpu_speed", BENCH / "gpu_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _timed(entry: dict) -> bool:
    return entry["s"] > 0 and entry["predicted_s"] > 0 and entry["ratio"] > 0


def test_the_rehearsal_writes_every_section(tmp_path):
    speed = _speed()
    assert speed.main(["--device", "cpu", "--tiny", "--repeats", "2", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "speed.json").read_text())
    assert [k for k in report if k in speed.SECTIONS] == list(speed.SECTIONS)
    assert not [k for k in speed.SECTIONS if "error" in report[k]], {k: report[k] for k in speed.SECTIONS}
    assert report["device"] == "cpu" and report["rates_from"].startswith("calibrated")
    assert "CUDA" in report["page_lock"]["probe"]["skipped"] and _timed(report["page_lock"]["pageable"])
    attention = report["attention"]
    for name in ("trl_layout", "slimrl_prefix", "causal_gqa"):
        assert _timed(attention[name]["forward"]) and _timed(attention[name]["forward_backward"])
        assert attention[name]["kernel"].startswith("aten::")
    assert "CUDA" in attention["cudnn"]["skipped"]
    assert _timed(report["mlp"]["peft_untiled"]) and _timed(report["mlp"]["tiled"]) and _timed(report["mlp"]["fused"])
    assert _timed(report["norm_rope"]["transformers"]) and "skipped" in report["norm_rope"]["liger"]
    assert _timed(report["head"]["trl"]) and _timed(report["head"]["slimrl_chunked"])
    toggles = report["toggles"]
    assert set(toggles) >= {"slimrl_default", "offload_toggled", "tiled_on", "chunked_head_off"}
    for name in ("slimrl_default", "offload_toggled", "tiled_on", "chunked_head_off"):
        assert _timed(toggles[name]) and toggles[name]["forward_s"] > 0 and toggles[name]["backward_s"] > 0
    assert toggles["tiled_on"]["settings"]["tiled"] and not toggles["chunked_head_off"]["settings"]["chunked"]
    by = report["profile"]["seconds_by_category"]
    assert by["gemm"] > 0 and sum(by.values()) > 0 and report["profile"]["idle_share"] is None  # CPU: no idle share
    assert _timed(report["trl"]) and report["trl"]["forward_s"] > 0


def test_a_section_past_the_budget_is_skipped_and_said(tmp_path):
    speed = _speed()
    argv = ["--device", "cpu", "--tiny", "--repeats", "1", "--out", str(tmp_path), "--budget-s", "0.001"]
    assert speed.main([*argv, "--sections", "page_lock,head"]) == 0
    report = json.loads((tmp_path / "speed.json").read_text())
    assert "section_s" in report["page_lock"] and "spent" in report["head"]["skipped"]
