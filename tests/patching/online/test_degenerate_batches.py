"""Batches with nothing (or almost nothing) to learn from: slimrl takes TRL's step on each of them.

Every case trains GRPO (and RLOO) two steps from the same seed, with TRL alone and after ``PatchFastRL``, through
each log-prob route slimrl has for the trainer (the shared-prefix layout, method capture with length groups, and
for RLOO on TRL >= 1.15 TRL's fused head with slimrl's kernel). A step must run where TRL's runs (never "element 0
of tensors does not require grad"), and the logged losses, every logged metric and the parameter updates must
agree:

* every completion cut at ``max_completion_length`` with ``mask_truncated_completions=True`` (Unsloth's Gemma 4
  2048 notebook): no token in the loss, loss 0, no update;
* zero-advantage groups (one reward for every completion): loss 0 without a KL term;
* one-token completions (EOS first, by a sequence bias) and ``max_completion_length=1``.

Tolerance: relative 1e-4 on updates and losses (fp32; tests/patching/parity.py), 1e-4 relative (absolute below 1)
on metrics; an update of zero must be zero on both sides (exactly: a masked token contributes ``0 * x``).
"""

from __future__ import annotations

import math

import pytest
import torch

from slimrl import PatchFastRL, unpatch
from slimrl.patching.routes import served
from tests.patching.parity import tiny_model
from tests.tiny import tiny_tokenizer

EOS = 1  # tests/tiny.py: the tiny model's eos id
PROMPTS = ["1+2=", "3+4=", "5+6=", "7+8="]

CASES = {
    # every completion reaches the length cut (EOS never sampled) and is masked out of the loss
    "all_truncated_masked": dict(
        max_completion_length=4, mask_truncated_completions=True, generation_kwargs={"suppress_tokens": [EOS]}
    ),
    # one reward for all: every advantage 0
    "zero_advantage": dict(max_completion_length=6, reward="constant"),
    # EOS first: every completion is one token
    "eos_first": dict(max_completion_length=6, generation_kwargs={"sequence_bias": {(EOS,): 60.0}}),
    "one_token": dict(max_completion_length=1),
}
ROUTES = {"shared_prefix": {}, "method_capture": {"slimrl_shared_prefix": False}}


def _run(tmp_path, trainer_name: str, case: dict, route: dict):
    """Two steps of ``trainer_name`` ("grpo" / "rloo") on the case; (log history rows, updates, trainer)."""
    import trl
    from datasets import Dataset

    case = dict(case)
    reward = case.pop("reward", "digits")
    model = tiny_model(lora=True, targets=("q_proj", "v_proj", "up_proj"))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def reward_fn(completions, **kwargs):
        if reward == "constant":
            return [1.0] * len(completions)
        return [float(sum(ch.isdigit() for ch in c)) + 0.1 * len(c) for c in completions]

    config_cls = trl.GRPOConfig if trainer_name == "grpo" else trl.RLOOConfig
    trainer_cls = trl.GRPOTrainer if trainer_name == "grpo" else trl.RLOOTrainer
    kwargs = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_steps=2,
        num_iterations=2,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        beta=0.0,
        temperature=0.9,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        logging_steps=1,
        seed=7,
        gradient_checkpointing=False,
        **case,
    )
    if trainer_name == "grpo":
        kwargs.update(loss_type="bnpo", disable_dropout=True)
    args = config_cls(**kwargs, **route)  # route: slimrl's own fields (only the patched config has them)
    trainer = trainer_cls(
        model=model,
        args=args,
        reward_funcs=[reward_fn],
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]),
        processing_class=tiny_tokenizer(),
    )
    trainer.train()
    deltas = {n: p.detach() - before[n] for n, p in model.named_parameters() if p.requires_grad}
    rows = [dict(h) for h in trainer.state.log_history if "loss" in h]
    return rows, deltas, trainer


SKIP = {
    "step_time",
    "tokens_per_s",
    "memory/peak_mb",
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "epoch",
    "num_tokens",
    "total_flos",
    "train_loss",
    "learning_rate",
}


def _check(tmp_path, trainer_name: str, case: dict, route: dict):
    unpatch()
    ref_rows, ref_deltas, _ = _run(tmp_path / "trl", trainer_name, case, {})
    PatchFastRL(trainer_name)
    try:
        rows, deltas, trainer = _run(tmp_path / "slim", trainer_name, case, route)
    finally:
        unpatch()
    assert served(trainer) > 0 or trainer_name == "rloo", "slimrl's log-prob path was not used"
    assert len(rows) == len(ref_rows) == 2
    for got, ref in zip(rows, ref_rows, strict=True):
        for key, value in ref.items():
            if key in SKIP or not isinstance(value, (int, float)) or math.isnan(value):
                continue
            assert key in got, f"metric {key} missing under slimrl"
            assert abs(got[key] - value) <= 1e-4 * max(abs(value), 1.0), f"{key}: {got[key]} vs TRL alone {value}"
    for name, ref in ref_deltas.items():
        if ref.abs().max() == 0:
            assert deltas[name].abs().max() == 0, f"{name} moved under slimrl, not under TRL alone"
        else:
            assert float((deltas[name] - ref).norm() / ref.norm()) <= 1e-4, name
    return ref_rows, ref_deltas


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("case", list(CASES))
def test_grpo_degenerate_batch_takes_trls_step(tmp_path, case, route):
    rows, deltas = _check(tmp_path, "grpo", CASES[case], ROUTES[route])
    if case == "all_truncated_masked":  # the case is what it says: every completion cut, nothing trained
        assert rows[0]["completions/clipped_ratio"] == 1.0  # one generation serves both steps (num_iterations=2)
        assert all(abs(r["loss"]) < 1e-6 for r in rows)
        assert all(float(d.abs().max()) == 0.0 for d in deltas.values())
    if case in ("eos_first", "one_token"):
        assert rows[0]["completions/mean_length"] == 1.0


@pytest.mark.parametrize("case", ["all_truncated_masked", "one_token"])
def test_rloo_degenerate_batch_takes_trls_step(tmp_path, case):
    """RLOO through its route of this TRL (fused head from 1.15, the replaced method before)."""
    rows, _ = _check(tmp_path, "rloo", CASES[case], {})
    if case == "all_truncated_masked":
        assert rows[0]["completions/clipped_ratio"] == 1.0


def test_all_masked_log_probs_keep_the_graph(tmp_path):
    """The op behind every route: no valid token still gives a result connected to the hidden states (zero
    gradient), as TRL's full-logits path does."""
    from slimrl.ops.chunked_logprob import masked_token_logprobs

    hidden = torch.randn(2, 3, 8, requires_grad=True)  # [B, T, H]
    weight = torch.randn(11, 8)  # [V, H]
    logps, _ = masked_token_logprobs(
        hidden, weight, torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.bool)
    )
    assert logps.requires_grad
    logps.sum().backward()
    assert hidden.grad is not None and float(hidden.grad.abs().max()) == 0.0
