"""``model.generate`` right after ``trainer.train()``, as notebooks try the trained model without calling
``for_inference``: it runs in inference mode (as Unsloth's ``generate`` does) and the training mode is back after.
Inside a patched trainer's step, TRL's own generation settings stand."""

from __future__ import annotations

import torch

from slimrl import FastLanguageModel, PatchFastRL, unpatch
from slimrl.models.modes import in_inference_mode, trainer_step


def _trained(tiny_model_dir, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tok = FastLanguageModel.from_pretrained(str(tiny_model_dir), max_seq_length=128)
    model = FastLanguageModel.get_peft_model(model, r=4, use_gradient_checkpointing=True, init_lora_weights=False)
    PatchFastRL("grpo")
    try:
        cfg = GRPOConfig(
            output_dir=str(tmp_path),
            per_device_train_batch_size=2,
            num_generations=2,
            max_completion_length=6,
            max_steps=1,
            report_to="none",
            use_cpu=True,
            bf16=False,
            save_strategy="no",
            logging_steps=1,
        )
        trainer = GRPOTrainer(
            model=model,
            args=cfg,
            reward_funcs=[lambda completions, **kw: [1.0] * len(completions)],
            train_dataset=Dataset.from_list([{"prompt": "1+1="}] * 2),
            processing_class=tok,
        )
        trainer.train()
    finally:
        unpatch()
    return model, tok


def test_greedy_generate_after_train_equals_for_inference(tiny_model_dir, tmp_path):
    model, tok = _trained(tiny_model_dir, tmp_path)
    assert model.training
    ids = tok("2+2=", return_tensors="pt")["input_ids"]
    right_after = model.generate(input_ids=ids, max_new_tokens=12, do_sample=False)
    assert model.training and not in_inference_mode(model)  # back in training mode
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    FastLanguageModel.for_inference(model)
    switched = model.generate(input_ids=ids, max_new_tokens=12, do_sample=False)
    FastLanguageModel.for_training(model)
    assert torch.equal(right_after, switched)


def test_inside_a_trainer_step_generate_keeps_the_trainers_settings(tiny_model_dir, monkeypatch):
    model, _ = FastLanguageModel.from_pretrained(str(tiny_model_dir), max_seq_length=64)
    model.train()
    seen = []
    monkeypatch.setattr(type(model), "generate", lambda self, *a, **k: seen.append(self.training))
    model.generate()
    with trainer_step():
        model.generate()
    assert seen == [False, True] and model.training
