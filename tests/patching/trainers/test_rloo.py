"""RLOO patched vs unpatched: two training steps with generation, old log-probs and the reference KL.

TRL >= 1.15 runs RLOO through its fused head (slimrl swaps the kernel); TRL 1.12 computes full logits in
``_get_per_token_logps_and_entropies`` (slimrl replaces the method). Same completions, LoRA/full updates within
relative error 1e-4 (fp32; see tests/patching/parity.py), same logged losses.
"""

from __future__ import annotations

import pytest

from tests.patching.parity import assert_patched_equals_unpatched, tiny_model
from tests.tiny import tiny_llama, tiny_tokenizer

PROMPTS = ["1+2=", "what is 3+4?", "5+6=", "7+8="]


def run_rloo(tmp_path, beta: float, lora: bool):
    """Two RLOO steps (SGD, so updates are proportional to gradients); returns completions seen, updates, losses."""
    from datasets import Dataset
    from trl import RLOOConfig, RLOOTrainer

    model = tiny_model(lora, targets=("q_proj", "v_proj", "up_proj"))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    seen: list[list[str]] = []

    def reward_digits(completions, **kwargs):
        seen.append(list(completions))
        return [float(sum(ch.isdigit() for ch in c)) for c in completions]

    args = RLOOConfig(
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
    )
    ds = Dataset.from_list([{"prompt": p} for p in PROMPTS])
    kwargs = {} if lora else {"ref_model": tiny_llama(seed=0)} if "ref_model" in _rloo_params() else {}
    trainer = RLOOTrainer(
        model=model,
        args=args,
        reward_funcs=[reward_digits],
        train_dataset=ds,
        processing_class=tiny_tokenizer(),
        **kwargs,
    )
    trainer.train()
    deltas = {n: p.detach() - before[n] for n, p in model.named_parameters() if p.requires_grad}
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return seen, deltas, losses, trainer


def _rloo_params() -> set[str]:
    import inspect

    from trl import RLOOTrainer

    return set(inspect.signature(RLOOTrainer.__init__).parameters)


@pytest.mark.parametrize(("beta", "lora"), [(0.05, True), (0.0, False)])
def test_rloo_parity_two_steps(tmp_path, beta, lora):
    """Generation, old log-probs (num_iterations=2), reference KL and the update, TRL alone vs patched (TRL >= 1.15:
    the fused-head kernel swap; older TRL: the replaced log-prob method)."""
    assert_patched_equals_unpatched(lambda out: run_rloo(out, beta, lora), "rloo", tmp_path)
