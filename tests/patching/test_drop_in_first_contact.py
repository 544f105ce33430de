"""The small things a new user meets at first contact: a warning TRL's constructor issues names the user's
line (not slimrl's wrapper around the constructor), the image-only processor fallback says why, a patched base
constructor stands aside when a patched TRL subclass already did slimrl's work, and the legacy keywords, Unsloth's
config keywords and the offline push reach a first-contact trainer."""

from __future__ import annotations

import warnings

import pytest

from slimrl import PatchFastRL, unpatch
from slimrl.patching.every_trainer.state import trainer_state
from tests.tiny import CPU_ARGS, tiny_llama, tiny_tokenizer


def _grpo(tmp_path, **kwargs):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        max_steps=1,
        **CPU_ARGS,
    )
    return GRPOTrainer(
        model=tiny_llama(),
        args=args,
        processing_class=tiny_tokenizer(),
        reward_funcs=[lambda completions, **k: [0.0] * len(completions)],
        train_dataset=Dataset.from_list([{"prompt": "1+1="}] * 2),
        **kwargs,
    )


def _rollout(prompts, trainer):  # never called: only built
    raise AssertionError


def test_a_warning_of_trls_constructor_names_the_users_line(tmp_path, monkeypatch):
    monkeypatch.delenv("TRL_EXPERIMENTAL_SILENCE", raising=False)
    PatchFastRL("grpo")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _grpo(tmp_path, rollout_func=_rollout)
    finally:
        unpatch()
    found = [w for w in caught if "rollout_func" in str(w.message)]
    assert found, [str(w.message)[:60] for w in caught]
    assert all(w.filename == __file__ for w in found), [(w.filename, w.lineno) for w in found]


def test_an_error_filter_still_raises_at_trls_warning(tmp_path, monkeypatch):
    """Re-attributed warnings go through the user's filters: ``error`` raises inside TRL's constructor as without
    slimrl."""
    monkeypatch.delenv("TRL_EXPERIMENTAL_SILENCE", raising=False)
    PatchFastRL("grpo")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*rollout_func")
            with pytest.raises(UserWarning, match="rollout_func"):
                _grpo(tmp_path, rollout_func=_rollout)
    finally:
        unpatch()


def test_image_only_fallback_names_the_reason():
    from slimrl.models.vision import first_line

    err = ImportError("\nQwen3VLVideoProcessor requires the Torchvision library but it was not found.\nMore text")
    assert first_line(err) == "Qwen3VLVideoProcessor requires the Torchvision library but it was not found."
    assert first_line(ImportError("")) == "ImportError" and first_line(ValueError("\n \n")) == "ValueError"


def test_a_patched_subclass_does_slimrls_work_once(tmp_path, monkeypatch):
    """GKD's constructor calls SFT's: with both patched, GKD's wrapper translates the keywords and records the trainer
    as gkd; SFT's wrapper runs only TRL's constructor (no second keyword warning, no second changed-settings table)."""
    from datasets import Dataset

    from tests.patching.parity import experimental

    gkd = experimental("gkd")
    PatchFastRL()
    try:
        args = gkd.GKDConfig(
            output_dir=str(tmp_path),
            max_steps=1,
            per_device_train_batch_size=2,
            report_to="none",
            save_strategy="no",
            max_new_tokens=4,
            unsloth_num_chunks=-1,
        )  # Unsloth's, at its default
        with pytest.raises(ValueError, match="unsloth_num_chunks=4.*no effect"):
            gkd.GKDConfig(output_dir=str(tmp_path), unsloth_num_chunks=4)
        from slimrl.verify.tiny import chat_tokenizer

        tok = chat_tokenizer()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = gkd.GKDTrainer(
                model=tiny_llama(vocab_size=len(tok)),
                teacher_model=tiny_llama(1, len(tok)),
                args=args,
                tokenizer=tok,  # the legacy keyword
                train_dataset=Dataset.from_list(
                    [{"messages": [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]}] * 2
                ),
            )
    finally:
        unpatch()
    legacy = [w for w in caught if "tokenizer=" in str(w.message)]
    assert len(legacy) == 1 and legacy[0].filename == __file__, [str(w.message)[:80] for w in legacy]
    assert trainer_state(trainer).algorithm == "gkd" and not trainer_state(trainer).building
    assert trainer.processing_class is tok


def test_online_dpo_generates_in_mallocs_recycling_phase(tmp_path, monkeypatch):
    """Online DPO's generation runs in the recycling phase, as GRPO's does (without it the lean mmap threshold made
    the KV cache page-fault afresh every token: 10-18 CPU-seconds more in the first SmolLM2 step)."""
    from contextlib import contextmanager

    from datasets import Dataset

    import slimrl.patching.trainers.online_dpo as online_dpo
    from tests.patching.parity import experimental

    entered: list[str] = []

    @contextmanager
    def recording():
        entered.append("in")
        yield

    monkeypatch.setattr(online_dpo, "recycling_phase", recording)
    exp = experimental("online_dpo")
    PatchFastRL("online_dpo")
    try:
        args = exp.OnlineDPOConfig(
            output_dir=str(tmp_path), per_device_train_batch_size=2, max_new_tokens=4, max_steps=1, **CPU_ARGS
        )
        alternate = lambda completions, **k: [float(i % 2) for i in range(len(completions))]  # noqa: E731
        trainer = exp.OnlineDPOTrainer(
            model=tiny_llama(),
            reward_funcs=[alternate],
            args=args,
            processing_class=tiny_tokenizer(),
            train_dataset=Dataset.from_list([{"prompt": "1+1="}] * 2),
        )
        trainer.train()
    finally:
        unpatch()
    assert entered, "TRL's _generate ran outside the recycling phase"
