"""slimrl keeps TRL's defaults: the only ones it changes are bf16 where TRL's own cannot run (no bf16-capable
accelerator and no precision flag) and use_vllm with the fast_inference engine, each announced once in a table."""

from __future__ import annotations

import warnings

import pytest
import torch

from slimrl import PatchFastRL, unpatch
from slimrl.patching import TRAINERS, trainer_and_config, trainer_available
from slimrl.patching.every_trainer.state import config_state
from tests.tiny import tiny_llama, tiny_tokenizer

NO_ACCELERATOR = not torch.cuda.is_available()


def _grpo(tmp_path, model, **cfg):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        max_steps=2,
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=False,
        **cfg,
    )
    return GRPOTrainer(
        model=model,
        args=config,
        reward_funcs=[lambda completions, **k: [1.0] * len(completions)],
        train_dataset=Dataset.from_list([{"prompt": "1+1="}] * 4),
        processing_class=tiny_tokenizer(),
    )


def _available_configs() -> dict[str, type]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {n: trainer_and_config(n)[1] for n in TRAINERS if trainer_available(n)}


@pytest.mark.skipif(not NO_ACCELERATOR, reason="the no-accelerator branch")
def test_gpu_style_configs_are_created_on_a_cpu(patched, tmp_path, capsys):
    """Unsloth-style scripts pass no precision flag: TRL's bf16=True default fails at config creation here; with
    slimrl every patched config is created with bf16 off, and the table says why."""
    configs = _available_configs()
    assert len(configs) >= 9
    for name, cls in configs.items():
        cfg = cls(output_dir=str(tmp_path))
        assert cfg.bf16 is False, name
        assert config_state(cfg).changed["bf16"][0] is True, name
    from trl import GRPOConfig

    with pytest.warns(FutureWarning, match="max_new_tokens"):
        cfg = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=1, num_generations=8, max_new_tokens=32)
    assert (cfg.bf16, cfg.max_completion_length) == (False, 32)
    _grpo(tmp_path, tiny_llama())
    out = capsys.readouterr().out
    assert "slimrl: settings changed in GRPOConfig (asked for -> what runs here" in out
    assert "bf16  True -> False (no bf16-capable accelerator" in out


@pytest.mark.skipif(not NO_ACCELERATOR, reason="the no-accelerator branch")
def test_without_slimrl_the_same_configs_fail_here(tmp_path):
    """Why the change above is needed: without slimrl, TRL's own default cannot run on a machine like this."""
    from trl import DPOConfig

    with pytest.raises(ValueError, match="Your setup doesn't support bf16/gpu"):
        DPOConfig(output_dir=str(tmp_path), beta=0.1)


def test_trl_precision_defaults_stay_where_they_run(patched, tmp_path, monkeypatch):
    """On a bf16-capable device (simulated: transformers' check answers yes) and with use_cpu=True, TRL's default
    stays: bf16 on, also for an fp32 model, and nothing is listed."""
    from trl import DPOConfig

    from slimrl.patching.every_trainer import defaults

    monkeypatch.setattr(defaults, "bf16_default_runs", lambda: True)
    import transformers.training_args as ta

    monkeypatch.setattr(ta, "is_torch_bf16_gpu_available", lambda *a, **k: True)
    cfg = DPOConfig(output_dir=str(tmp_path), beta=0.1)
    assert cfg.bf16 is True and not config_state(cfg).changed
    monkeypatch.undo()

    trainer = _grpo(tmp_path, tiny_llama(), use_cpu=True)  # fp32 model, TRL's bf16 default
    assert trainer.args.bf16 is True and "bf16" not in config_state(trainer.args).changed
    assert trainer.accelerator.mixed_precision == "bf16", "TRL's bf16 autocast must stay on"


def test_explicit_flags_are_kept_and_nothing_is_listed(patched, tmp_path, capsys):
    trainer = _grpo(tmp_path, tiny_llama(), logging_steps=5, bf16=False, use_cpu=True)
    assert trainer.args.logging_steps == 5 and trainer.args.bf16 is False
    assert "settings changed" not in capsys.readouterr().out


def test_logging_steps_and_log_history_are_trls(tmp_path):
    """A TRL script reads the final training metrics from ``log_history[-1]`` (merged into the last log at TRL's
    logging_steps=10): the same keys with and without slimrl."""

    def keys(tag):
        trainer = _grpo(tmp_path / tag, tiny_llama(), use_cpu=True, bf16=False)
        assert trainer.args.logging_steps == 10
        trainer.train()
        return set(trainer.state.log_history[-1])

    plain = keys("trl")
    PatchFastRL("grpo")
    try:
        ours = keys("slimrl")
    finally:
        unpatch()
    assert "reward" in plain and "train_loss" in plain
    slimrl_metrics = {"memory/peak_mb", "tokens_per_s"}  # and the run-health metrics (slimrl.health)
    assert {k for k in ours - slimrl_metrics if not k.startswith("health/")} == plain


@pytest.mark.parametrize(("gpu", "fp16"), [("t4", True), ("v100", True), ("a100-40gb", False), ("h100", False)])
def test_a_gpu_without_bf16_in_hardware_trains_trls_default_in_fp16(fake_gpu, gpu, fp16):
    """TRL's bf16 default on a T4 or V100 would train under emulated bf16 autocast (transformers accepts it: torch's
    check counts emulation): the config gets fp16 with the scaler, listed; a bf16 card keeps TRL's default, and a
    flag the user passed is kept everywhere."""
    from trl import DPOConfig, GRPOConfig

    from slimrl.patching.every_trainer.defaults import apply_config_defaults

    fake_gpu(gpu)
    for cls in (GRPOConfig, DPOConfig):
        kwargs, changed = apply_config_defaults(cls, {"output_dir": "out"})
        if fp16:
            assert (kwargs["bf16"], kwargs["fp16"]) == (False, True), (gpu, cls)
            assert "no bf16 in hardware" in changed["bf16"][1] and changed["fp16"] == (False, "True")
        else:
            assert "bf16" not in kwargs and "fp16" not in kwargs and not changed, (gpu, cls)
        for mine in ({"bf16": True}, {"bf16": False}, {"fp16": True}, {"use_cpu": True}):
            kwargs, changed = apply_config_defaults(cls, {"output_dir": "out", **mine})
            assert kwargs == {"output_dir": "out", **mine} and not changed, (gpu, mine)
