"""The vLLM releases slimrl's engine is tested with, declared once (``VLLM_SUPPORTED``) and said where it matters:
pyproject's ``vllm`` extra pins the same range, and ``from_pretrained(fast_inference=True)`` on another release says
so in one line with what to install (the engine still starts: never worse than refusing)."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import pytest

from slimrl.compat import vllm_info

ROOT = Path(__file__).resolve().parents[2]


def test_the_vllm_extra_pins_the_tested_range():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (spec,) = [r for r in extras["vllm"] if r.startswith("vllm")]
    from packaging.requirements import Requirement

    assert str(Requirement(spec).specifier) == str(Requirement("vllm" + vllm_info.VLLM_SUPPORTED).specifier)


@pytest.mark.parametrize(
    ("installed", "said"),
    [
        ("0.32.0", False),
        ("0.32.3", False),
        ("0.31.0", True),
        ("0.33.0", True),
        ("0.32.0+cpu", False),
        ("garbage", True),
    ],
)
def test_a_release_outside_the_range_gets_one_line_naming_the_install(installed, said):
    note = vllm_info.vllm_version_note(installed)
    assert (note is not None) == said
    if said:
        assert installed in note and "pip install 'slimrl[vllm]'" in note and vllm_info.VLLM_SUPPORTED in note


def test_fast_inference_on_an_untested_vllm_says_so_once(monkeypatch):
    from slimrl.models import engine_setup

    monkeypatch.setattr(engine_setup, "vllm_status", lambda: None)  # as if vLLM ran here
    monkeypatch.setattr(vllm_info, "installed_vllm", lambda: "0.35.1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert engine_setup.engine_problem(True, vision=False) is None  # the engine still starts
    lines = [str(w.message) for w in caught if "0.35.1" in str(w.message)]
    assert len(lines) == 1 and "outside the releases" in lines[0]
    monkeypatch.setattr(vllm_info, "installed_vllm", lambda: "0.32.0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine_setup.engine_problem(True, vision=False)
    assert not [w for w in caught if "outside the releases" in str(w.message)]
