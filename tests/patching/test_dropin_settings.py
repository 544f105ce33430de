"""Settings Unsloth-era scripts and TRL's example scripts pass that this machine or this TRL cannot take: each is
changed to the nearest one that runs and listed once in the changed-settings table (or dropped with a warning), never
a refusal; ``SLIMRL_STRICT=1`` keeps TRL's own refusal. Each case is also run without slimrl, to show TRL alone
refuses it here (so the test is not vacuous)."""

from __future__ import annotations

import pytest
import torch

from slimrl.patching.every_trainer.state import config_state
from tests.tiny import tiny_llama, tiny_tokenizer

NO_GPU = not torch.cuda.is_available()


def _grpo_config(tmp_path, **kw):
    from trl import GRPOConfig

    base = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        max_steps=1,
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=False,
    )
    return GRPOConfig(**{**base, **kw})


def test_warmup_ratio_becomes_warmup_steps(patched, tmp_path):
    with pytest.warns(FutureWarning, match=r"warmup_ratio=0.1\) is transformers' old name"):
        cfg = _grpo_config(tmp_path, warmup_ratio=0.1)
    assert cfg.warmup_steps == pytest.approx(0.1)
    with pytest.raises(ValueError, match=r"warmup_ratio=2 is invalid|warmup_ratio=2\) is invalid"):
        _grpo_config(tmp_path, warmup_ratio=2)
    with pytest.raises(TypeError, match="pass warmup_steps= only"):
        _grpo_config(tmp_path, warmup_ratio=0.1, warmup_steps=5)


def test_warmup_ratio_is_refused_by_trl_alone(tmp_path):
    from trl import GRPOConfig

    if "warmup_ratio" in GRPOConfig.__dataclass_fields__:
        pytest.skip("this transformers still has warmup_ratio")
    with pytest.raises(TypeError, match="warmup_ratio"):
        _grpo_config(tmp_path, warmup_ratio=0.1, bf16=False, use_cpu=True)


def test_max_prompt_length_on_configs_is_dropped_with_a_warning(patched, tmp_path):
    from trl import GRPOConfig

    if "max_prompt_length" in GRPOConfig.__dataclass_fields__:
        pytest.skip("this TRL's GRPOConfig still has max_prompt_length")
    with pytest.warns(FutureWarning, match=r"GRPOConfig\(max_prompt_length=...\) is ignored"):
        cfg = _grpo_config(tmp_path, max_prompt_length=256)
    assert not hasattr(cfg, "max_prompt_length")


@pytest.mark.skipif(not NO_GPU, reason="the machine without a GPU")
def test_gpu_precision_flags_become_fp32_here(patched, tmp_path, capsys):
    cfg = _grpo_config(tmp_path, bf16=True)
    assert cfg.bf16 is False and config_state(cfg).changed["bf16"][0] is True
    cfg = _grpo_config(tmp_path, fp16=True, bf16=False)  # runs here (accelerate's fp16 on a CPU): kept
    assert cfg.fp16 is True and "fp16" not in config_state(cfg).changed
    cfg = _grpo_config(tmp_path, bf16=True, use_cpu=True)  # bf16 autocast on a CPU, asked for: it runs, kept
    assert cfg.bf16 is True and "bf16" not in config_state(cfg).changed


@pytest.mark.skipif(not NO_GPU, reason="the machine without a GPU")
def test_gpu_precision_flags_are_refused_by_trl_alone_and_strict(tmp_path, monkeypatch):
    with pytest.raises(ValueError):
        _grpo_config(tmp_path, bf16=True)
    from slimrl import PatchFastRL, unpatch

    monkeypatch.setenv("SLIMRL_STRICT", "1")
    PatchFastRL("grpo")
    try:
        with pytest.raises(ValueError):
            _grpo_config(tmp_path, bf16=True)
    finally:
        unpatch()


def test_bitsandbytes_optimizer_without_bitsandbytes_becomes_adamw_torch(patched, tmp_path, monkeypatch):
    import slimrl.compat.quant as quant

    monkeypatch.setattr(quant, "bitsandbytes_works", lambda: False)
    for optim in ("adamw_8bit", "paged_adamw_8bit"):
        cfg = _grpo_config(tmp_path, optim=optim, bf16=False, use_cpu=True)
        assert cfg.optim == "adamw_torch"
        assert config_state(cfg).changed["optim"][0] == optim
    monkeypatch.setattr(quant, "bitsandbytes_works", lambda: True)
    cfg = _grpo_config(tmp_path, optim="adamw_8bit", bf16=False, use_cpu=True)
    assert cfg.optim == "adamw_8bit" and "optim" not in config_state(cfg).changed


def _grpo_trainer(tmp_path, **kw):
    from datasets import Dataset
    from trl import GRPOTrainer

    return GRPOTrainer(
        model=tiny_llama(),
        args=_grpo_config(tmp_path, bf16=False, use_cpu=True, **kw),
        reward_funcs=[lambda completions, **k: [1.0] * len(completions)],
        train_dataset=Dataset.from_list([{"prompt": "1+1="}] * 4),
        processing_class=tiny_tokenizer(),
    )


def _without_vllm() -> bool:
    from slimrl.compat.vllm_info import vllm_status

    return vllm_status() is not None


@pytest.mark.skipif(not _without_vllm(), reason="vLLM runs here: use_vllm is kept")
def test_use_vllm_without_vllm_generates_with_transformers(tmp_path, capsys):
    with pytest.raises(ImportError):  # TRL alone
        _grpo_trainer(tmp_path / "trl", use_vllm=True)
    from slimrl import PatchFastRL, unpatch

    PatchFastRL("grpo")
    try:
        trainer = _grpo_trainer(tmp_path / "slim", use_vllm=True)
        assert trainer.use_vllm is False and trainer.args.use_vllm is False
        assert "use_vllm" in capsys.readouterr().out
        trainer.train()
        assert trainer.state.global_step == 1
    finally:
        unpatch()


def test_push_to_hub_offline_saves_and_says_so(patched, tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    trainer = _grpo_trainer(tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert trainer.push_to_hub() is None
    assert (tmp_path / "config.json").exists()
    assert "push_to_hub skipped: HF_HUB_OFFLINE is set" in capsys.readouterr().out


def test_chat_template_returns_token_ids_as_unsloth_scripts_expect(tmp_path):
    """transformers 5 returns a BatchEncoding where Unsloth-era scripts expect ids; on the tokenizer slimrl
    returns, a tokenizing call without ``return_dict`` gets the ids; TRL's explicit calls are unchanged."""
    from slimrl.models.tokenizers import with_token_id_chat_templates

    tok = tiny_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    messages = [{"role": "user", "content": "1+1="}]
    plain = tok.apply_chat_template(messages, tokenize=True)
    with_token_id_chat_templates(tok)
    ids = tok.apply_chat_template(messages, tokenize=True)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    assert ids == (plain["input_ids"] if hasattr(plain, "keys") else plain)
    assert hasattr(tok.apply_chat_template(messages, tokenize=True, return_dict=True), "keys")
    assert isinstance(tok.apply_chat_template(messages, tokenize=False), str)


def _sft_trainer(tmp_path, **kw):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        max_steps=1,
        report_to="none",
        save_strategy="no",
        bf16=False,
        use_cpu=True,
        **kw,
    )
    return SFTTrainer(
        model=tiny_llama(),
        args=args,
        processing_class=tiny_tokenizer(),
        train_dataset=Dataset.from_list([{"text": "1+1=2"}] * 4),
    )


@pytest.mark.skipif(not NO_GPU, reason="the machine without a GPU")
@pytest.mark.parametrize("make", [_sft_trainer, _grpo_trainer])
def test_use_liger_kernel_without_a_gpu_trains_with_one_line(tmp_path, capsys, make):
    """TRL's own switch (TRL's LoRA/QLoRA notebook): TRL alone stops at the first step here (Liger is Triton, and
    transformers asks for the package first); with slimrl it is False, one row in the table, and the step runs."""
    from slimrl import PatchFastRL, unpatch

    unpatch()
    with pytest.raises((ImportError, RuntimeError)):
        make(tmp_path / "trl", use_liger_kernel=True).train()
    PatchFastRL()
    try:
        trainer = make(tmp_path / "slim", use_liger_kernel=True)
        out = capsys.readouterr().out
        trainer.train()
    finally:
        unpatch()
    assert trainer.args.use_liger_kernel is False
    assert out.count("use_liger_kernel") == 1 and "True -> False" in out
