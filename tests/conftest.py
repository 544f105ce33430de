"""Fixtures every test folder shares.

* ``patched``: every trainer the installed TRL has patched for the test (``grpo_patched``: GRPO only);
* every test ends with TRL restored (``unpatch()``), so no test leaks patches into the next;
* ``avx512bf16``: bitsandbytes believes this CPU has AVX512-BF16 (its 4-bit layers read that when built), so the
  eval-mode repacking that breaks gradients (slimrl/models/quantized.py) happens here too;
* ``fake_gpu``: a GPU of slimrl's table presented through torch's CUDA API (tests/fake_gpu.py);
* ``tiny_model_dir``: a directory with the 2-layer tiny Llama and its character tokenizer (tests/tiny.py), the shape
  ``FastLanguageModel.from_pretrained`` and ``slimrl train --model`` read.

``tests.tiny.CPU_ARGS`` holds the config keywords every CPU test passes to a TRL config.
"""

from __future__ import annotations

import os
from pathlib import Path

# The suite decides when TRL is patched (each test starts from TRL as it is); the patch on first use of
# slimrl.FastLanguageModel is tested in its own process (tests/patching/test_autopatch.py).
os.environ.setdefault("SLIMRL_AUTOPATCH", "0")
# Tests replace TRL methods with spies and stand-ins, which the self-check on an untested TRL would see as a changed
# signature (slimrl.patching.every_trainer.preflight); tests/patching/test_future_trl.py turns it on where it is the
# subject.
os.environ.setdefault("SLIMRL_SELF_CHECK", "0")

import pytest

from slimrl import PatchFastRL, unpatch
from tests.tiny import tiny_llama, tiny_tokenizer


@pytest.fixture(autouse=True)
def _trl_restored():
    yield
    unpatch()


@pytest.fixture
def patched():
    PatchFastRL()
    yield


@pytest.fixture
def grpo_patched():
    PatchFastRL("grpo")
    yield


@pytest.fixture
def tiny_model_dir(tmp_path) -> Path:
    path = tmp_path / "tiny-model"
    tiny_llama().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture
def fake_gpu(monkeypatch):
    """``gpu = fake_gpu("t4")``: that GPU of slimrl's table presented through torch's CUDA API (tests/fake_gpu.py)
    for the rest of the test."""
    from tests.fake_gpu import clear_transformers_cache, present

    yield lambda name: present(monkeypatch, name)
    monkeypatch.undo()
    clear_transformers_cache()


@pytest.fixture
def avx512bf16(monkeypatch):
    modules = pytest.importorskip("bitsandbytes.nn.modules")
    monkeypatch.setattr(modules, "has_avx512bf16", lambda: True)
