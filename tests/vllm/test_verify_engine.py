"""``slimrl verify --fast_inference``: GRPO and RLOO rows generating through slimrl's colocated engine (vLLM's CPU
build) pass the generator check, and an engine that misses the adapter sync fails it."""

from __future__ import annotations

import pytest
import torch

from slimrl.generation import vllm_status

pytestmark = pytest.mark.skipif(vllm_status() is not None, reason=f"vLLM not usable here: {vllm_status()}")


def test_engine_rows_pass():
    from slimrl.verify import GEN_TOLERANCE_VLLM, verify

    rows = [r for r in verify(["grpo", "rloo"], fast_inference=True) if r.generator == "engine"]
    assert [(r.trainer, r.passed) for r in rows] == [("grpo", True), ("rloo", True)], rows
    assert all(0 <= r.gen_err <= GEN_TOLERANCE_VLLM[torch.float32] for r in rows)


def test_an_engine_that_misses_the_sync_fails(monkeypatch):
    """After the first sync the engine keeps its adapter: the later steps sample from a stale one."""
    from slimrl.generation.trl_backend import SlimrlVLLMGeneration
    from slimrl.verify import GEN_TOLERANCE_VLLM, verify

    real = SlimrlVLLMGeneration.sync_weights

    def first_only(self):
        if self.engine.lora_request is None:
            real(self)

    monkeypatch.setattr(SlimrlVLLMGeneration, "sync_weights", first_only)
    (row,) = [r for r in verify(["grpo"], loss_type="dapo", fast_inference=True) if r.generator == "engine"]
    assert row.loss_type == "dapo"
    assert not row.passed and row.gen_err > 10 * GEN_TOLERANCE_VLLM[torch.float32], row
