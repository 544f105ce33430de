"""A new user's first run: no deprecation warning caused by slimrl's own calls, the package metadata is clean."""

from __future__ import annotations

import tomllib
import traceback
import warnings
from pathlib import Path

from tests.tiny import tiny_llama, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SLIMRL = str(ROOT / "slimrl")


def _callers_of_deprecations(run) -> list[str]:
    """The ``file:line`` that called each deprecated API which warned while ``run()`` ran (the frame just above
    the one that emitted the FutureWarning / DeprecationWarning)."""
    found = []

    def show(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, FutureWarning | DeprecationWarning):
            return
        stack = traceback.extract_stack()[:-1]
        emitting = max((i for i, f in enumerate(stack) if f.filename == filename), default=None)
        if emitting:
            caller = stack[emitting - 1]
            found.append(f"{caller.filename}:{caller.lineno}: {str(message)[:80]}")

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        old, warnings.showwarning = warnings.showwarning, show
        try:
            run()
        finally:
            warnings.showwarning = old
    return found


def test_slimrl_calls_no_deprecated_transformers_api(tmp_path):
    from datasets import Dataset

    from slimrl import FastLanguageModel, PatchFastRL, unpatch

    def run():
        tiny_llama().save_pretrained(tmp_path / "m")
        tiny_tokenizer().save_pretrained(tmp_path / "m")
        PatchFastRL("grpo", FastLanguageModel)
        try:
            from trl import GRPOConfig, GRPOTrainer

            model, tok = FastLanguageModel.from_pretrained(str(tmp_path / "m"), max_seq_length=64)
            model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8)
            cfg = GRPOConfig(
                output_dir=str(tmp_path / "o"),
                per_device_train_batch_size=2,
                num_generations=2,
                max_completion_length=4,
                max_steps=1,
                report_to="none",
                save_strategy="no",
            )
            trainer = GRPOTrainer(
                model=model,
                args=cfg,
                processing_class=tok,
                reward_funcs=[lambda completions, **k: [1.0] * len(completions)],
                train_dataset=Dataset.from_list([{"prompt": "1+1="}] * 2),
            )
            trainer.train()
            FastLanguageModel.for_inference(model)
            FastLanguageModel.for_training(model)
        finally:
            unpatch()

    ours = [c for c in _callers_of_deprecations(run) if c.startswith(SLIMRL)]
    assert not ours, ours


def test_package_license_is_an_spdx_string():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"


def test_the_detector_sees_a_deprecated_call():
    """The check above can fail: a deprecated transformers call made from this file is attributed to it."""
    model = tiny_llama()
    found = _callers_of_deprecations(lambda: model.gradient_checkpointing_enable())
    assert any(c.startswith(__file__) for c in found), found
