"""GMPO (``trl.experimental.gmpo``, a ``GRPOTrainer`` whose only change is ``_compute_loss``) through the route it
inherits from GRPO: patched vs TRL alone, two steps with generation, old log-probs (``num_iterations=2``) and a KL
to the reference (beta > 0), LoRA with random A and B, plain SGD (an update is proportional to its gradient).

Tolerance: relative error <= 1e-4 on the whole update and the first loss (fp32; the two paths sum the vocabulary in
different orders and chunks, ~1e-6 relative per reduction, accumulated over a 2-layer backward and two steps), as
for GRPO (:mod:`tests.patching.trainers.test_grpo`).
"""

from __future__ import annotations

import pytest
import torch

from slimrl import PatchFastRL, unpatch
from slimrl.patching.every_trainer.state import trainer_state
from tests.patching.parity import assert_patched_equals_unpatched, experimental
from tests.tiny import tiny_llama, tiny_tokenizer


def run_gmpo(tmp_path, beta: float):
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model

    gmpo = experimental("gmpo")
    tok = tiny_tokenizer()
    model = tiny_llama(seed=0)
    torch.manual_seed(1)
    model = get_peft_model(
        model,
        LoraConfig(
            r=4,
            lora_alpha=8,
            target_modules=["q_proj", "v_proj", "up_proj"],
            init_lora_weights=False,
            task_type="CAUSAL_LM",
        ),
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    seen: list[list[str]] = []

    def reward_digits(completions, **kwargs):
        seen.append(list(completions))
        return [float(sum(ch.isdigit() for ch in c)) for c in completions]

    args = gmpo.GMPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=12,
        max_steps=2,
        num_iterations=2,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        beta=beta,
        temperature=0.9,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        logging_steps=1,
        seed=7,
        gradient_checkpointing=False,
        disable_dropout=True,
    )
    trainer = gmpo.GMPOTrainer(
        model=model,
        args=args,
        reward_funcs=[reward_digits],
        processing_class=tok,
        train_dataset=Dataset.from_list([{"prompt": p} for p in ["1+2=", "3+4="]]),
    )
    trainer.train()
    deltas = {n: p.detach() - before[n] for n, p in model.named_parameters() if p.requires_grad}
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return seen, deltas, losses, trainer


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_gmpo_patched_equals_trl(tmp_path, beta):
    trainer = assert_patched_equals_unpatched(lambda out: run_gmpo(out, beta), "gmpo", tmp_path)
    assert type(trainer).__name__ == "GMPOTrainer"
    assert trainer_state(trainer).algorithm == "gmpo"
    assert trainer.state.log_history[0]["memory/peak_mb"] > 0  # GRPO's step metrics, logged once per step


def test_gmpo_alone_patches_the_grpo_methods_it_runs_and_unpatch_restores_them():
    """``PatchFastRL("gmpo")`` installs GRPO's patches (GMPO runs GRPOTrainer's methods) and GMPO's own; ``unpatch``
    takes all of them away again, also where GRPO was patched first and unpatched in between."""
    from trl import GRPOTrainer

    gmpo = experimental("gmpo")
    trl_logps = GRPOTrainer.__dict__["_get_per_token_logps_and_entropies"]
    trl_loss = gmpo.GMPOTrainer.__dict__["_compute_loss"]
    PatchFastRL("gmpo")
    try:
        assert GRPOTrainer.__dict__["_get_per_token_logps_and_entropies"] is not trl_logps
        assert gmpo.GMPOTrainer.__dict__["_compute_loss"] is not trl_loss
        PatchFastRL("grpo")
        unpatch("grpo")  # GMPO still patched: GRPO's methods stay
        assert GRPOTrainer.__dict__["_get_per_token_logps_and_entropies"] is not trl_logps
    finally:
        unpatch()
    assert GRPOTrainer.__dict__["_get_per_token_logps_and_entropies"] is trl_logps
    assert gmpo.GMPOTrainer.__dict__["_compute_loss"] is trl_loss
