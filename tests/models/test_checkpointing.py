"""Activation checkpointing modes: same gradients as no checkpointing; offload chosen only where it helps."""

from __future__ import annotations

import logging

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.models import checkpointing


def _grads(model_dir, mode):
    model, _ = FastLanguageModel.from_pretrained(str(model_dir))
    model = FastLanguageModel.get_peft_model(model, r=4, use_gradient_checkpointing=mode, init_lora_weights=False)
    model.train()
    ids = torch.randint(0, 49, (3, 21), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    return model, {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("mode", ["slimrl", True])
def test_checkpointed_gradients_equal_plain(tiny_model_dir, mode):
    """fp32 recompute of the same ops: equal to 1e-6 relative (recompute repeats the exact kernels on CPU)."""
    _, ref = _grads(tiny_model_dir, False)
    model, got = _grads(tiny_model_dir, mode)
    layers = model.get_base_model().model.layers
    assert all(layer.gradient_checkpointing for layer in layers)
    for name, g in ref.items():
        torch.testing.assert_close(got[name], g, rtol=1e-6, atol=1e-7)


def test_slimrl_mode_on_cpu_is_plain_and_says_so(tiny_model_dir, caplog):
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with caplog.at_level(logging.INFO, logger="slimrl.models.checkpointing"):
        _grads(tiny_model_dir, "slimrl")
    assert "plain checkpointing (no CUDA device" in caplog.text


class _Args:
    def __init__(self, on=True, kwargs=None):
        self.activation_checkpointing = self.gradient_checkpointing = on
        self.activation_checkpointing_kwargs = self.gradient_checkpointing_kwargs = kwargs


def _model(mode):
    m = torch.nn.Linear(1, 1)
    m.slimrl_config = {"gradient_checkpointing": mode}
    return m


def test_trainer_config_gets_offload_only_for_slimrl_on_cuda(monkeypatch):
    monkeypatch.setattr(checkpointing.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(checkpointing, "offload_supported", lambda: True)
    args = _Args(kwargs={"use_reentrant": False})
    checkpointing.align_trainer_checkpointing(_model("slimrl"), args)
    assert args.activation_checkpointing_kwargs == {"use_reentrant": False, "offload": True}
    assert args.gradient_checkpointing_kwargs == args.activation_checkpointing_kwargs

    for mode, args in [(True, _Args()), ("slimrl", _Args(on=False)), ("slimrl", _Args(kwargs={"offload": False}))]:
        before = dict(args.activation_checkpointing_kwargs or {})
        checkpointing.align_trainer_checkpointing(_model(mode), args)
        assert dict(args.activation_checkpointing_kwargs or {}) == before  # plain mode, GC off, or user's choice


def test_no_offload_without_cuda(monkeypatch):
    monkeypatch.setattr(checkpointing.torch.cuda, "is_available", lambda: False)
    args = _Args()
    checkpointing.align_trainer_checkpointing(_model("slimrl"), args)
    assert args.activation_checkpointing_kwargs is None
