"""The metrics slimrl adds to GRPO's log mean what the README says: ``memory/peak_mb`` is the peak of that step,
generation included, even when the engine resets the peak counter between its phases."""

from __future__ import annotations

import pytest
import torch

from slimrl import PatchFastRL, unpatch
from slimrl.compat.memory import peak_bytes, peak_window, reset_peak
from tests.tiny import tiny_llama, tiny_tokenizer

CPU = torch.device("cpu")


def _clear_refs_works() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _clear_refs_works(), reason="the host peak cannot be reset here")
MB = 2**20


def test_windows_nest_through_inner_resets():
    with peak_window(CPU) as outer:
        big = torch.ones(300 * MB // 4)  # 300 MB, touched
        del big
        reset_peak(CPU)  # what the engine does after generation
        assert peak_bytes(CPU) < outer.peak_bytes() - 200 * MB
        with peak_window(CPU) as inner:
            pass
        assert outer.peak_bytes() >= inner.peak_bytes()
    assert outer.peak_bytes() > 300 * MB


def test_grpo_step_peak_includes_generation_and_is_per_step(tmp_path):
    """A reward function (run inside the step, like generation) allocates 400 MB, frees it and resets the peak
    counter the way the engine's standby does: that step's ``memory/peak_mb`` still shows it; the next step's,
    without the allocation, does not (it is the step's peak, not the process's)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    calls = []

    def reward(completions, **kwargs):
        if not calls:
            block = torch.ones(400 * MB // 4)
            del block
            reset_peak(CPU)
        calls.append(1)
        return [1.0] * len(completions)

    PatchFastRL("grpo")
    try:
        cfg = GRPOConfig(
            output_dir=str(tmp_path),
            per_device_train_batch_size=2,
            num_generations=2,
            max_completion_length=4,
            max_steps=2,
            report_to="none",
            use_cpu=True,
            bf16=False,
            save_strategy="no",
            logging_steps=1,
            gradient_checkpointing=False,
        )
        trainer = GRPOTrainer(
            model=tiny_llama(),
            args=cfg,
            reward_funcs=[reward],
            train_dataset=Dataset.from_list([{"prompt": "1+1="}] * 4),
            processing_class=tiny_tokenizer(),
        )
        trainer.train()
    finally:
        unpatch()
    peaks = [row["memory/peak_mb"] for row in trainer.state.log_history if "memory/peak_mb" in row]
    assert len(peaks) == 2
    assert peaks[0] > peaks[1] + 300, peaks
