"""Activation checkpointing modes: same gradients as no checkpointing; offload chosen only where it helps, its
copies bit-exact, and kept through the Trainer's re-enable."""

from __future__ import annotations

import logging

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.models import checkpointing, offload


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


def _layer_funcs(model):
    return [layer._gradient_checkpointing_func for layer in model.get_base_model().model.layers]


def test_offloaded_checkpointing_is_bit_exact_and_prefetches(tiny_model_dir, monkeypatch):
    """The offloader's bookkeeping (pack -> host copy, unpack with one layer of look-ahead) on CPU, where its copies
    are synchronous: every layer input goes through it and the gradients equal plain checkpointing bit for bit."""
    monkeypatch.setattr(offload, "MIN_BYTES", 0)  # the tiny model's layer inputs are a few KB
    _, ref = _grads(tiny_model_dir, True)
    model, _ = FastLanguageModel.from_pretrained(str(tiny_model_dir))
    model = FastLanguageModel.get_peft_model(model, r=4, use_gradient_checkpointing=True, init_lora_weights=False)
    base = model.get_base_model()
    offloader = checkpointing.install_policy(base, offload=True)
    checkpointing.turn_on(base)  # as the Trainer does at train()
    assert all(getattr(f, "slimrl_offloader", None) is offloader for f in _layer_funcs(model))
    model.train()
    ids = torch.randint(0, 49, (3, 21), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    layers = len(base.model.layers)
    assert offloader.packed >= layers and offloader.fetched_ahead >= layers - 1
    assert offloader._last is not None and offloader._last() is None, "host copies outlive the backward (a leak)"
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert torch.equal(p.grad, ref[name]), name
    checkpointing.uninstall_policy(base)
    checkpointing.turn_on(base)
    assert not any(hasattr(f, "slimrl_offloader") for f in _layer_funcs(model))


def test_slimrl_mode_installs_the_offload_only_on_cuda(tiny_model_dir, monkeypatch):
    model, _ = FastLanguageModel.from_pretrained(str(tiny_model_dir))
    model = FastLanguageModel.get_peft_model(model, r=4, use_gradient_checkpointing="slimrl")
    assert not any(hasattr(f, "slimrl_offloader") for f in _layer_funcs(model))  # CPU: plain
    for mode, offloaded in [(True, False), ("unsloth", True)]:
        model, _ = FastLanguageModel.from_pretrained(str(tiny_model_dir))
        with monkeypatch.context() as m:
            m.setattr(checkpointing.torch.cuda, "is_available", lambda: True)
            model = FastLanguageModel.get_peft_model(model, r=4, use_gradient_checkpointing=mode)
        assert all(hasattr(f, "slimrl_offloader") == offloaded for f in _layer_funcs(model)), mode


def test_selective_checkpointing_is_exact_and_kept_through_the_trainers_enable(tiny_model_dir):
    """``"selective"``: every 2nd layer checkpointed (the tiny model has 2: [on, off]), still after the Trainer's
    own enable (every layer), and the gradients equal no checkpointing's (1e-6 relative: the same kernels)."""
    _, ref = _grads(tiny_model_dir, False)
    model, got = _grads(tiny_model_dir, "selective")
    base = model.get_base_model()
    assert [layer.gradient_checkpointing for layer in base.model.layers] == [True, False]
    checkpointing.turn_on(base)  # what the Trainer does at train()
    assert [layer.gradient_checkpointing for layer in base.model.layers] == [True, False]
    for name, g in ref.items():
        torch.testing.assert_close(got[name], g, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="checkpoint_every_n_layers must be a positive int"):
        FastLanguageModel.get_peft_model(
            FastLanguageModel.from_pretrained(str(tiny_model_dir))[0],
            r=4,
            use_gradient_checkpointing="selective",
            checkpoint_every_n_layers=0,
        )


def test_paused_turns_checkpointing_off_and_back_without_deprecated_names():
    """slimrl's pause (the truncated-sampling fix's no-grad pass) and turn_off use transformers' current names: no
    FutureWarning/DeprecationWarning is raised by a call slimrl makes (TRL's own helper called the deprecated
    ``is_gradient_checkpointing`` / ``gradient_checkpointing_disable`` / ``_enable``)."""
    from slimrl.models.checkpointing import is_on, paused, turn_off, turn_on
    from tests.test_first_contact import _callers_of_deprecations
    from tests.tiny import tiny_llama

    model = tiny_llama()
    turn_on(model)
    seen = []

    def run():
        with paused(model, {"use_reentrant": False}):
            seen.append(is_on(model))
        seen.append(is_on(model))
        turn_off(model)
        seen.append(is_on(model))

    found = _callers_of_deprecations(run)  # whoever calls them: only slimrl's code runs on a transformers model here
    assert not found, found
    assert seen == [False, True, False]


def test_the_deprecation_check_sees_trls_helper():
    """The check above can fail: TRL's own pause helper, on the same model, warns (transformers >= 5.19)."""
    from slimrl.models.checkpointing import has_activation_checkpointing_enable, turn_on
    from tests.test_first_contact import _callers_of_deprecations
    from tests.tiny import tiny_llama

    if not has_activation_checkpointing_enable():
        pytest.skip("this transformers has not renamed gradient checkpointing: nothing is deprecated")
    from trl.models.utils import disable_gradient_checkpointing

    model = tiny_llama()
    turn_on(model)

    def run():
        with disable_gradient_checkpointing(model, {"use_reentrant": False}):
            pass

    assert _callers_of_deprecations(run)
