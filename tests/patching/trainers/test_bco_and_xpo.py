"""BCO and XPO (in TRL up to 1.13.0): patched vs unpatched, on the TRL release that has them.

BCO: one batch, same trainer, loss + gradients + logged metrics (tests/patching/parity.py, 1e-4).
XPO: two training steps with generation, SGD updates within relative error 1e-4, same logged losses.
Skipped under a TRL without these trainers (the suite runs them in the trl 1.12.0 environment of `make test`).
"""

from __future__ import annotations

import pytest
import torch

from slimrl.patching import trainer_available
from tests.patching.parity import PAIRS, assert_parity, experimental, tiny_model
from tests.tiny import tiny_llama, tiny_tokenizer


@pytest.mark.skipif(not trainer_available("bco"), reason="this TRL has no BCOTrainer (last in 1.13.0)")
@pytest.mark.parametrize("lora", [False, True])
def test_bco_parity(tmp_path, lora):
    from datasets import Dataset

    bco = experimental("bco")
    rows = [
        {"prompt": r["prompt"], "completion": r[k], "label": k == "chosen"}
        for r in PAIRS
        for k in ("chosen", "rejected")
    ]
    args = bco.BCOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        gradient_checkpointing=False,
        max_steps=1,
        seed=3,
        max_length=64,
    )
    trainer = bco.BCOTrainer(
        model=tiny_model(lora),
        ref_model=None if lora else tiny_llama(seed=0),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tiny_tokenizer(),
    )
    metrics = assert_parity(trainer, "bco")
    assert {"logits/chosen_sum", "logits/rejected_sum"} <= metrics.keys()


def run_xpo(tmp_path, lora: bool):
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForSequenceClassification

    xpo = experimental("xpo")
    model = tiny_model(lora)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    torch.manual_seed(5)
    reward_model = LlamaForSequenceClassification(
        LlamaConfig(
            vocab_size=49,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_labels=1,
            pad_token_id=0,
        )
    )
    args = xpo.XPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        max_new_tokens=10,
        max_length=64,
        max_steps=2,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        logging_steps=1,
        seed=7,
        gradient_checkpointing=False,
    )
    trainer = xpo.XPOTrainer(
        model=model,
        ref_model=None if lora else tiny_llama(seed=0),
        reward_funcs=reward_model,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": r["prompt"]} for r in PAIRS]),
        processing_class=tiny_tokenizer(),
        reward_processing_classes=tiny_tokenizer(),
    )
    trainer.train()
    deltas = {n: p.detach() - before[n] for n, p in model.named_parameters() if p.requires_grad}
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return [], deltas, losses, trainer  # completions: XPO samples inside its step, compared through the updates


@pytest.mark.skipif(not trainer_available("xpo"), reason="this TRL has no XPOTrainer (last in 1.13.0)")
@pytest.mark.parametrize("lora", [False, True])
def test_xpo_parity_two_steps(tmp_path, lora):
    from tests.patching.parity import assert_patched_equals_unpatched

    assert_patched_equals_unpatched(lambda out: run_xpo(out, lora), "xpo", tmp_path)
