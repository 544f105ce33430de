"""TRL's RLOOTrainer generating through the fast_inference engine (real SmolLM2-135M, vLLM's CPU build)."""

from __future__ import annotations

import math

import pytest
import torch

from slimrl.generation import vllm_status

pytestmark = pytest.mark.skipif(vllm_status() is not None, reason=f"vLLM not usable here: {vllm_status()}")


def test_rloo_generates_through_the_engine_one_sync_per_step(tmp_path):
    from slimrl import FastLanguageModel, PatchFastRL, unpatch
    from slimrl.data import correctness_reward, make_arithmetic_dataset
    from slimrl.generation.trl_backend import SlimrlVLLMGeneration

    PatchFastRL("rloo", FastLanguageModel)
    try:
        from trl import RLOOConfig, RLOOTrainer

        model, tok = FastLanguageModel.from_pretrained(
            "SmolLM2-135M-Instruct", max_seq_length=256, dtype=torch.float32, fast_inference=True, max_lora_rank=8
        )
        model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, use_gradient_checkpointing=False)
        cfg = RLOOConfig(
            output_dir=str(tmp_path),
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=16,
            max_steps=2,
            report_to="none",
            use_cpu=True,
            bf16=False,
            save_strategy="no",
            logging_steps=1,
        )
        trainer = RLOOTrainer(
            model=model,
            args=cfg,
            train_dataset=make_arithmetic_dataset(16),
            processing_class=tok,
            reward_funcs=[correctness_reward],
        )
        assert trainer.use_vllm and isinstance(trainer.vllm_generation, SlimrlVLLMGeneration)
        trainer.train()
        engine = model.vllm_engine
        assert engine.adapter_id == 2 and engine.timings["syncs"] == 2
        logs = [h for h in trainer.state.log_history if "loss" in h]
        assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
        assert all(h["completions/max_length"] <= 16 and "memory/generation_peak_mb" in h for h in logs)
    finally:
        unpatch()
