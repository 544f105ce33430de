"""``from_pretrained(load_in_fp8=True)``: the engine's weights in vLLM's FP8 where the GPU runs it, presented for
every GPU of the table through torch's CUDA API (tests/fake_gpu.py). vLLM's own minimum for its fp8 method is
checked against this table in tests/vllm/test_gpu_start.py (it needs vLLM installed)."""

from __future__ import annotations

import pytest

from slimrl.compat.gpus import GPUS
from slimrl.models import engine_setup


@pytest.mark.parametrize("gpu", [g.key for g in GPUS])
def test_fp8_where_the_gpu_runs_it(fake_gpu, capfd, gpu):
    card = fake_gpu(gpu).gpu
    capfd.readouterr()
    got = engine_setup.engine_quantization(True, engine=True)
    err = capfd.readouterr().err
    if card.capability >= (8, 9):  # fp8 arithmetic: W8A8, nothing to say
        assert got == "fp8" and err == ""
    elif card.capability >= (7, 5):  # T4, A10G, A100: vLLM's weight-only FP8 (Marlin), one line
        assert got == "fp8" and err.count("weight-only FP8") == 1
    else:  # V100: 16-bit, one line
        assert got is None and err.count("the engine runs in 16-bit") == 1


def test_fp8_not_asked_without_an_engine_or_on_a_cpu(capfd):
    assert engine_setup.engine_quantization(False, engine=True) is None
    assert capfd.readouterr().err == ""
    assert engine_setup.engine_quantization(True, engine=False) is None
    assert "no vLLM engine" in capfd.readouterr().err
    assert engine_setup.engine_quantization(True, engine=True) is None  # this machine: no GPU
    assert "vLLM's CPU backend runs no fp8 weights" in capfd.readouterr().err


def test_load_in_fp8_is_taken_by_from_pretrained(tiny_model_dir, capfd):
    """Not handed to transformers (a TypeError there); without an engine the one line says why it does nothing."""
    from slimrl import FastLanguageModel

    model, _ = FastLanguageModel.from_pretrained(str(tiny_model_dir), max_seq_length=64, load_in_fp8=True)
    assert model is not None and "load_in_fp8=True" in capfd.readouterr().err
