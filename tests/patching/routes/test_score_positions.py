"""ORPO and CPO (full logits in TRL 1.12 and 1.16): patched vs unpatched loss, gradients and logged metrics.

Every loss type CPOConfig offers (sigmoid, hinge, ipo, simpo, alphapo) plus CPO with ``cpo_alpha=0``; ORPO with a
full fine-tune and with LoRA. Same trainer, same batch, run with TRL alone and after ``PatchFastRL`` (see
tests/patching/parity.py for the method and the 1e-4 tolerance).
"""

from __future__ import annotations

import pytest

from slimrl.compat.trl_info import config_choices
from tests.patching.parity import PAIRS, assert_parity, experimental, tiny_model
from tests.tiny import tiny_llama, tiny_tokenizer

COMMON = dict(
    per_device_train_batch_size=4,
    report_to="none",
    use_cpu=True,
    bf16=False,
    save_strategy="no",
    gradient_checkpointing=False,
    max_steps=1,
    seed=3,
    max_length=64,
)


def orpo_trainer(tmp_path, lora=False, **cfg):
    from datasets import Dataset

    orpo = experimental("orpo")
    args = orpo.ORPOConfig(output_dir=str(tmp_path), **{**COMMON, **cfg})
    return orpo.ORPOTrainer(
        model=tiny_model(lora), args=args, train_dataset=Dataset.from_list(PAIRS), processing_class=tiny_tokenizer()
    )


def cpo_trainer(tmp_path, lora=False, **cfg):
    from datasets import Dataset

    cpo = experimental("cpo")
    args = cpo.CPOConfig(output_dir=str(tmp_path), **{**COMMON, **cfg})
    return cpo.CPOTrainer(
        model=tiny_model(lora), args=args, train_dataset=Dataset.from_list(PAIRS), processing_class=tiny_tokenizer()
    )


@pytest.mark.parametrize("lora", [False, True])
def test_orpo_parity(tmp_path, lora):
    metrics = assert_parity(orpo_trainer(tmp_path, lora=lora, beta=0.2), "orpo")
    assert {"nll_loss", "log_odds_ratio", "logits/chosen", "logits/rejected"} <= metrics.keys()


def _cpo_loss_types() -> list[str]:
    return config_choices(experimental("cpo").CPOConfig)


@pytest.mark.parametrize("loss_type", _cpo_loss_types())
def test_cpo_parity_every_loss_type(tmp_path, loss_type):
    metrics = assert_parity(cpo_trainer(tmp_path, loss_type=loss_type, cpo_alpha=0.5), "cpo")
    assert {"nll_loss", "logits/chosen", "logits/rejected"} <= metrics.keys()


def test_cpo_parity_without_nll_and_with_lora(tmp_path):
    assert_parity(cpo_trainer(tmp_path, lora=True, loss_type="sigmoid", cpo_alpha=0.0), "cpo")


def run_online_dpo(tmp_path, lora: bool):
    """Two Online DPO steps (SGD): completions sampled, updates and losses."""
    from datasets import Dataset

    odpo = experimental("online_dpo")
    model = tiny_model(lora)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    seen: list[list[str]] = []

    def reward_digits(completions, **kwargs):
        seen.append(list(completions))
        return [float(sum(ch.isdigit() for ch in c)) - 0.1 * len(c) for c in completions]

    args = odpo.OnlineDPOConfig(
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
    ref = None if lora else tiny_llama(seed=0)
    trainer = odpo.OnlineDPOTrainer(
        model=model,
        ref_model=ref,
        reward_funcs=[reward_digits],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": r["prompt"]} for r in PAIRS]),
        processing_class=tiny_tokenizer(),
    )
    trainer.train()
    deltas = {n: p.detach() - before[n] for n, p in model.named_parameters() if p.requires_grad}
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return seen, deltas, losses, trainer


@pytest.mark.parametrize("lora", [False, True])
def test_online_dpo_parity_two_steps(tmp_path, lora):
    from tests.patching.parity import assert_patched_equals_unpatched

    assert_patched_equals_unpatched(lambda out: run_online_dpo(out, lora), "online_dpo", tmp_path)
