"""Dataset layouts of TRL's agentic GRPO (``environment_factory``): slimrl's checks accept what TRL alone accepts
(a dataset whose environment owns the prompt: an ``environment`` column only, or no dataset at all with
``max_steps``) and still refuse, with its own line, a dataset without ``prompt`` when no environment supplies one."""

from __future__ import annotations

import inspect

import pytest

from slimrl import PatchFastRL, unpatch
from slimrl.verify.agentic import Counter  # an environment that owns its data: reset() gives the prompt
from tests.tiny import CPU_ARGS, tiny_llama, tiny_tokenizer


def _has_environments() -> bool:
    from trl import GRPOTrainer

    return "environment_factory" in inspect.signature(GRPOTrainer.__init__).parameters


pytestmark = pytest.mark.skipif(not _has_environments(), reason="this TRL's GRPOTrainer has no environment_factory")


def ones(completions, **kwargs):
    return [1.0] * len(completions)


def digits(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in str(c))) for c in completions]


def _build(tmp_path, dataset, steps: int = 1):
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_chat_template

    tok = tiny_tokenizer()
    tok.chat_template = qwen3_chat_template  # a tool-capable template TRL knows how to parse responses of
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        max_steps=steps,
        gradient_checkpointing=False,
        seed=5,
        learning_rate=0.1,
        logging_steps=1,
        **CPU_ARGS,
    )
    return GRPOTrainer(
        model=tiny_llama(),
        args=args,
        reward_funcs=[digits],
        train_dataset=dataset,
        processing_class=tok,
        environment_factory=Counter,
    )


def _environment_only():
    from datasets import Dataset

    return Dataset.from_list([{"environment": "counter"}] * 4)


@pytest.mark.parametrize("dataset", [_environment_only, lambda: None], ids=["environment column only", "no dataset"])
def test_an_environment_that_owns_the_data_is_accepted_as_trl_accepts_it(tmp_path, dataset):
    alone = _build(tmp_path / "trl", dataset())  # TRL alone takes it
    PatchFastRL("grpo")
    try:
        patched = _build(tmp_path / "slimrl", dataset())
    finally:
        unpatch()
    assert type(patched).__name__ == type(alone).__name__ == "GRPOTrainer"
    assert len(patched.train_dataset) == len(alone.train_dataset)


def test_without_an_environment_a_dataset_needs_its_prompt_column(tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    PatchFastRL("grpo")
    try:
        args = GRPOConfig(
            output_dir=str(tmp_path),
            per_device_train_batch_size=2,
            num_generations=2,
            max_completion_length=4,
            max_steps=1,
            **CPU_ARGS,
        )
        with pytest.raises(ValueError, match="train_dataset has no 'prompt' column \\(columns: environment\\)"):
            GRPOTrainer(
                model=tiny_llama(),
                args=args,
                reward_funcs=[ones],
                processing_class=tiny_tokenizer(),
                train_dataset=Dataset.from_list([{"environment": "counter"}] * 4),
            )
    finally:
        unpatch()


def test_environment_owned_data_trains_as_trl_alone(tmp_path):
    """Two steps on the environment-only dataset, TRL alone vs patched: the same losses and the same update
    (fp32 on one thread; 1e-4 relative, the log-prob routes' vocabulary-chunk order)."""
    import torch

    from slimrl.patching.routes import served

    def run(tag):
        trainer = _build(tmp_path / tag, _environment_only(), steps=2)
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        delta = torch.cat([(p.detach() - before[n]).flatten() for n, p in trainer.model.named_parameters()])
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]
        return losses, delta, served(trainer)

    losses_trl, delta_trl, _ = run("trl")
    PatchFastRL("grpo")
    try:
        losses, delta, calls = run("slimrl")
    finally:
        unpatch()
    assert calls > 0, "slimrl's log-prob path was not used"
    assert len(losses) == 2 and losses == pytest.approx(losses_trl, rel=1e-4, abs=1e-6)
    assert float(delta_trl.norm()) > 0 and float((delta - delta_trl).norm() / delta_trl.norm()) < 1e-4
