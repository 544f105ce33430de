"""``slimrl_longest_first``: step 1 generates completions of exactly ``max_completion_length`` tokens (the run's worst
case), later steps sample as TRL does, and an out-of-memory in step 1 is reported with the plan's numbers."""

from __future__ import annotations

import pytest
import torch

from slimrl import PatchFastRL, unpatch
from slimrl.patching.online import logps
from tests.tiny import CPU_ARGS, tiny_llama, tiny_tokenizer

LENGTH = 24
SEED = 5  # samples an early end-of-sequence in steps 1 and 2 without the option


def _run(tmp_path, steps: int = 2, **cfg):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    def reward(completions, **kwargs):
        return [float(len(c)) for c in completions]

    ds = Dataset.from_list([{"prompt": p} for p in ["1+2=", "3+4=", "5+6=", "7+8="]])
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=LENGTH,
        max_steps=steps,
        logging_steps=1,
        learning_rate=1e-3,
        seed=SEED,
        temperature=1.0,
        gradient_checkpointing=False,
        **CPU_ARGS,
        **cfg,
    )
    trainer = GRPOTrainer(
        model=tiny_llama(), args=args, reward_funcs=[reward], train_dataset=ds, processing_class=tiny_tokenizer()
    )
    trainer.train()
    return trainer, [
        (h["completions/min_length"], h["completions/max_length"])
        for h in trainer.state.log_history
        if "completions/min_length" in h
    ]


@pytest.fixture
def grpo_patched():
    unpatch()
    PatchFastRL("grpo")
    yield
    unpatch()


def test_first_step_at_full_length_then_as_usual(grpo_patched, tmp_path):
    _, usual = _run(tmp_path / "usual")
    assert usual[0][0] < LENGTH, "the seed must sample an early end-of-sequence, or the test is vacuous"
    trainer, forced = _run(tmp_path / "forced", slimrl_longest_first=True)
    assert forced[0] == (LENGTH, LENGTH)  # every completion of step 1 at full length
    assert forced[1][0] < LENGTH  # step 2 samples as TRL does
    assert trainer.generation_config.min_new_tokens is None  # restored


def test_out_of_memory_in_step_one_names_the_plan(grpo_patched, tmp_path, monkeypatch):
    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected)")

    monkeypatch.setattr(logps, "logps_and_entropies_through_ops", no_memory)
    with pytest.raises(
        MemoryError,
        match=r"slimrl_longest_first: step 1, with completions of 24 tokens.*"
        r"slimrl plan predicts a peak of [0-9.]+ GiB",
    ):
        _run(tmp_path, steps=1, slimrl_longest_first=True)
