"""The page-lock probe under a presented GPU: each way a machine can refuse, and what the probe then says.

The CUDA runtime's answers are stood in for (``cudaHostRegister``'s error code, ``torch.empty(pin_memory=True)``
raising, the copy's early return); the copy itself runs on a lent GPU (``bench/gpu_speed.py``'s ``page_lock``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from slimrl.compat import page_lock


@pytest.fixture
def runtime(monkeypatch, fake_gpu):
    """``set(register=0, allocates=True, early=True)``: how the presented H100's runtime answers."""
    fake_gpu("h100")
    monkeypatch.setattr(page_lock, "_FOUND", {})
    log: list = []
    answers = {"register": 0, "allocates": True, "early": True}
    real_empty = torch.empty

    def empty(*args, pin_memory=False, **kwargs):
        if pin_memory:
            log.append("allocate")
            if not answers["allocates"]:
                raise RuntimeError("CUDA error: out of memory (cudaHostAlloc)")
        return real_empty(*args, **kwargs)

    def register(ptr, nbytes, flags):
        log.append("register")
        return answers["register"]

    cudart = SimpleNamespace(cudaHostRegister=register, cudaHostUnregister=lambda ptr: log.append("unregister"))
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(page_lock, "_copy_returns_early", lambda host, device: log.append("copy") or answers["early"])

    def set_(**kw):
        answers.update(kw)
        return log

    return set_


def test_registration_works(runtime):
    log = runtime()
    lock = page_lock.probe(torch.device("cuda"))
    assert lock.registers and lock.overlaps and lock.line() == ""
    assert log == ["register", "copy", "unregister"]
    assert page_lock.probe(torch.device("cuda", 0)) is lock and log.count("register") == 1  # once per device


def test_registration_refused_pinned_allocation_is_the_fallback(runtime):
    log = runtime(register=1)
    lock = page_lock.probe(torch.device("cuda"))
    assert not lock.registers and lock.allocates and lock.overlaps and lock.register_error == 1
    assert log == ["register", "allocate", "copy"]


def test_nothing_pins(runtime):
    log = runtime(register=712, allocates=False)
    lock = page_lock.probe(torch.device("cuda"))
    assert not lock.overlaps and not lock.copies_async
    assert "cudaHostRegister error 712" in lock.line() and "ulimit -l" in lock.line()
    assert log == ["register", "allocate"]  # no copy to time


def test_a_copy_that_waits_for_completion(runtime):
    runtime(early=False)
    lock = page_lock.probe(torch.device("cuda"))
    assert lock.registers and not lock.overlaps and "waited for completion" in lock.line()
