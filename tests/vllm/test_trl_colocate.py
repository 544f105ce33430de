"""TRL's own colocate path (``use_vllm=True, vllm_mode="colocate"``, the model given by name with a
``peft_config``, as TRL's grpo.py / rloo.py scripts run) through slimrl's engine on vLLM's CPU build: TRL's own
``VLLMGeneration`` stops there in vLLM's ``load_weights`` (with or without slimrl), slimrl's engine generates on the
training model's base weights and syncs only the adapter (slimrl/patching/online/colocate_engine.py).

Tolerance: the importance ratio within 1 +- 0.02 over two steps (tests/vllm/test_engine_families.py's bar)."""

from __future__ import annotations

import warnings

import pytest

from slimrl.generation import vllm_status
from tests.tiny import save_tiny_family

pytestmark = pytest.mark.skipif(vllm_status() is not None, reason=f"vLLM not usable here: {vllm_status()}")


def test_grpo_by_name_in_colocate_mode_generates_through_slimrls_engine(tmp_path):
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from slimrl import PatchFastRL, unpatch
    from slimrl.generation.trl_backend import SlimrlVLLMGeneration

    path = save_tiny_family("qwen2", tmp_path / "m")
    PatchFastRL("grpo")
    try:
        args = GRPOConfig(
            output_dir=str(tmp_path / "out"),
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=8,
            max_steps=2,
            learning_rate=1e-3,
            beta=0.0,
            report_to="none",
            use_cpu=True,
            bf16=False,
            save_strategy="no",
            logging_steps=1,
            use_vllm=True,
            vllm_mode="colocate",
            vllm_gpu_memory_utilization=0.3,
            vllm_max_model_length=128,
            seed=3,
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = GRPOTrainer(
                model=path,
                args=args,
                peft_config=LoraConfig(r=8, lora_alpha=16),
                reward_funcs=[lambda completions, **k: [float(len(c)) for c in completions]],
                train_dataset=Dataset.from_list([{"prompt": "hello world"}] * 8),
            )
            trainer.train()
    finally:
        unpatch()
    assert isinstance(trainer.vllm_generation, SlimrlVLLMGeneration)
    said = [str(w.message) for w in caught if "slimrl's engine generates for" in str(w.message)]
    assert len(said) == 1, said
    engine = trainer.vllm_generation.engine
    assert engine.shared_bytes > 0, "the engine holds its own copy of the base weights"
    rows = [h for h in trainer.state.log_history if "loss" in h]
    assert len(rows) == 2
    for row in rows:
        assert abs(row["sampling/importance_sampling_ratio/mean"] - 1) <= 0.02, row
