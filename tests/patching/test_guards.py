"""The NaN/inf stop on the other trainers' training_step (GRPO's is in tests/test_bad_input.py)."""

from __future__ import annotations

import pytest
import torch

from slimrl import PatchFastRL, unpatch
from tests.tiny import tiny_llama, tiny_tokenizer

PAIRS = [{"prompt": f"{a}+1=", "chosen": str(a + 1), "rejected": str(a + 2)} for a in range(4)]


def test_dpo_nan_step_is_stopped_before_the_update(tmp_path):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from slimrl.patching.guards import NonFiniteStepError

    model = tiny_llama()
    PatchFastRL("dpo")
    try:
        trainer = DPOTrainer(model=model, ref_model=tiny_llama(), train_dataset=Dataset.from_list(PAIRS),
                             processing_class=tiny_tokenizer(),
                             args=DPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=2,
                                            report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                                            gradient_checkpointing=False))
        model.model.norm.register_forward_hook(lambda m, a, out: out * float("nan") if torch.is_grad_enabled()
                                               else out)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(NonFiniteStepError, match=r"step 1: the loss is nan; the update was not applied.*no "
                                                     r"checkpoint was written yet"):
            trainer.train()
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "weights changed"
    finally:
        unpatch()


def test_every_trainer_refuses_an_empty_dataset(tmp_path):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer

    PatchFastRL()
    try:
        for trainer_cls, config_cls in ((DPOTrainer, DPOConfig), (KTOTrainer, KTOConfig)):
            with pytest.raises(ValueError, match="train_dataset is empty: pass a dataset with at least one row"):
                trainer_cls(model=tiny_llama(), args=config_cls(output_dir=str(tmp_path), use_cpu=True, bf16=False),
                            train_dataset=Dataset.from_list([]), processing_class=tiny_tokenizer())
    finally:
        unpatch()


def test_rloo_reward_function_errors_are_named(tmp_path):
    from datasets import Dataset
    from trl import RLOOConfig, RLOOTrainer

    def bad_length(completions, **kwargs):
        return [0.0]

    PatchFastRL("rloo")
    try:
        trainer = RLOOTrainer(model=tiny_llama(), reward_funcs=[bad_length],
                              train_dataset=Dataset.from_list([{"prompt": "1+2="}] * 4),
                              processing_class=tiny_tokenizer(),
                              args=RLOOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2,
                                              num_generations=2, max_completion_length=4, max_steps=1, beta=0.0,
                                              report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                                              gradient_checkpointing=False))
        with pytest.raises(ValueError, match=r"reward function 'bad_length' returned 1 values for 2 completions"):
            trainer.train()
    finally:
        unpatch()
