"""The TRL-facing pieces of fast_inference that need no vLLM: sampling keywords, use_vllm default, dispatch."""

from __future__ import annotations

import pytest

from slimrl.generation.trl_backend import SlimrlVLLMGeneration, engine_of, sampling_kwargs
from slimrl.patching.every_trainer.state import config_state
from slimrl.patching.online.engine_hooks import apply_engine_defaults, slimrl_vllm_generation_factory
from slimrl.sampling import vLLMSamplingParams

TRAINER = {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}


def test_sampling_keywords_trainer_then_user_then_fixed():
    user = vLLMSamplingParams(top_p=0.9, stop=["</answer>"], max_tokens=10_000)
    kw = sampling_kwargs(TRAINER, user, max_completion_length=64)
    assert kw["temperature"] == 0.7 and kw["top_p"] == 0.9 and kw["stop"] == ["</answer>"]
    assert kw["max_tokens"] == 64  # capped: TRL pads/masks completions to max_completion_length
    assert kw["n"] == 1 and kw["logprobs"] == 0
    assert sampling_kwargs(TRAINER, None, 32)["max_tokens"] == 32
    assert sampling_kwargs(TRAINER, {"max_tokens": 8}, 32)["max_tokens"] == 8


def test_sampling_keywords_slimrl_owns_are_refused_with_a_warning():
    with pytest.warns(UserWarning, match=r"vllm_sampling_params: n=8 is ignored \(slimrl sets n=1"):
        kw = sampling_kwargs(TRAINER, vLLMSamplingParams(n=8), 16)
    assert kw["n"] == 1


class _Engine:
    llm = None
    max_num_seqs = 64
    sampling_params = None


class _Config:
    def __init__(self, use_vllm=False, explicit=()):
        self.use_vllm = use_vllm
        self.vllm_sampling_params = {"top_k": 5}
        config_state(self).explicit = frozenset(explicit)


class _Model:
    def __init__(self, engine=None):
        if engine is not None:
            self.vllm_engine = engine


def test_engine_turns_use_vllm_on_unless_the_user_set_it():
    engine = _Engine()
    cfg = _Config()
    apply_engine_defaults(_Model(engine), cfg)
    assert cfg.use_vllm is True and config_state(cfg).changed["use_vllm"] == (False, "True (fast_inference engine)")
    assert engine.sampling_params == {"top_k": 5}
    kept = _Config(use_vllm=False, explicit=("use_vllm",))
    apply_engine_defaults(_Model(engine), kept)
    assert kept.use_vllm is False and not config_state(kept).changed
    plain = _Config()
    apply_engine_defaults(_Model(), plain)  # no engine: TRL's default stays
    assert plain.use_vllm is False


def test_engine_found_through_wrappers():
    engine = _Engine()

    class Wrapper:
        def __init__(self, module):
            self.module = module

    assert engine_of(Wrapper(Wrapper(_Model(engine)))) is engine
    assert engine_of(_Model()) is None


class _Accelerator:
    def unwrap_model(self, model):
        return model


def test_dispatch_engine_vs_trls_own_class(monkeypatch):
    calls = []

    class TRLGeneration:
        def __init__(self, *args, **kwargs):
            calls.append(kwargs.get("mode"))

    factory = slimrl_vllm_generation_factory(TRLGeneration)
    monkeypatch.setattr("slimrl.patching.online.engine_hooks._is_peft", lambda model: True)
    engine = _Engine()
    ours = factory(
        model=_Model(engine),
        accelerator=_Accelerator(),
        processing_class=None,
        mode="colocate",
        max_num_seqs=16,
        temperature=0.5,
        max_completion_length=24,
        logprobs=0,
    )
    assert isinstance(ours, SlimrlVLLMGeneration) and engine.max_num_seqs == 16
    assert ours.sampling["temperature"] == 0.5 and ours.sampling["max_tokens"] == 24
    assert isinstance(
        factory(model=_Model(), accelerator=_Accelerator(), processing_class=None, mode="colocate"), TRLGeneration
    )
    with pytest.warns(UserWarning, match="fast_inference engine not used \\(vllm_mode='server'\\)"):
        factory(model=_Model(engine), accelerator=_Accelerator(), processing_class=None, mode="server")
    assert calls == ["colocate", "server"]


def test_engine_found_under_an_adapter_added_with_peft_directly():
    """``peft.get_peft_model`` on a FastLanguageModel model (not FastLanguageModel.get_peft_model) leaves the engine
    on the inner model, two levels under PEFT's tuner."""
    from peft import LoraConfig, get_peft_model

    from tests.tiny import tiny_llama

    engine = _Engine()
    base = tiny_llama()
    base.vllm_engine = engine
    peft_model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"]))
    assert "vllm_engine" not in peft_model.__dict__
    assert engine_of(peft_model) is engine
