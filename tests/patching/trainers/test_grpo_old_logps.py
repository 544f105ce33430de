"""GRPO with vLLM's importance-sampling correction: slimrl skips TRL's old-log-prob pass where it equals the policy
forward (:mod:`slimrl.patching.online.old_logps`) and must give TRL's loss, updates and ``sampling/*`` metrics.

No vLLM in this venv: TRL's ``VLLMGeneration`` is replaced (for both runs) by :class:`FakeVLLM`, which returns
deterministic completions of mixed lengths and sampled-token log-probs = the current model's (at the trainer's
temperature) shifted per row by 0, 0.6 or 1.2 nats plus noise, so the IS ratio is truncated / masked for some rows
and tokens. The real engine case is ``tests/vllm/test_grpo_engine.py``.

Each case trains two steps from the same seed with TRL alone and patched (plain SGD, random LoRA A and B, as in
``test_grpo.py``); two micro-batches per generation batch (``gradient_accumulation_steps=2``) so the IS metrics are
summed over micro-batches.

Tolerances: slimrl with the lever vs slimrl without it (TRL's pass through the same op): relative 1e-4
(measured <= 1.2e-5: the pass and the policy forward batch rows differently, and a masked IS ratio passes that
on). slimrl vs TRL alone: relative 3e-4 on updates, 1e-4 on losses and metrics (fp32; the op and TRL's head sum
the vocabulary in different orders; measured up to 1.4e-4 on the smallest LoRA-B update, cispo, entries ~1e-5
where per-token terms cancel).
"""

from __future__ import annotations

import pytest
import torch

from slimrl import PatchFastRL, unpatch
from slimrl.compat.trl_info import grpo_loss_types
from slimrl.patching.online.mismatch import NAMES as MISMATCH
from tests.patching.parity import rel, tiny_model
from tests.tiny import tiny_tokenizer

IS_MODES = ["sequence_mask", "sequence_truncate", "token_mask", "token_truncate"]


class FakeVLLM:
    """TRL's ``VLLMGeneration`` surface (``sync_weights``, ``generate``) without vLLM; see the module docstring."""

    def __init__(self, model=None, accelerator=None, processing_class=None, *, temperature=1.0, **kwargs):
        self.model, self.accelerator, self.temperature = model, accelerator, temperature
        self.calls = 0

    def sync_weights(self) -> None:
        pass

    @torch.no_grad()
    def generate(self, prompts, images, num_generations, profiler=None):
        g = torch.Generator().manual_seed(100 + self.calls)
        self.calls += 1
        completions, logprobs = [], []
        model = self.accelerator.unwrap_model(self.model)
        for i, prompt in enumerate(prompts):
            n = 3 + (5 * i + self.calls) % 10  # 3..12 tokens
            ids = torch.randint(3, 49, (n,), generator=g).tolist()
            if i % 2:
                ids[-1] = 1  # some end with EOS
            seq = torch.tensor([list(prompt) + ids])
            logits = model(input_ids=seq).logits[0, len(prompt) - 1 : -1] / self.temperature  # [n, V]
            true = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]  # [n]
            sampled = true - 0.6 * (i % 3) + 0.05 * torch.randn(n, generator=g)
            completions.append(ids)
            logprobs.append([[float(x)] for x in sampled])
        return prompts, completions, logprobs, [[[t] for t in c] for c in completions]


def run(tmp_path, loss_type="grpo", mode="sequence_mask", **overrides):
    """Two GRPO steps with the fake vLLM; returns (completions, LoRA updates, losses, sampling metrics, no-grad
    log-prob calls)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model = tiny_model(lora=True, targets=("q_proj", "v_proj", "up_proj"))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    seen: list[list[str]] = []

    def reward_digits(completions, **kwargs):
        seen.append(list(completions))
        return [float(sum(ch.isdigit() for ch in c)) + 0.1 * len(c) for c in completions]

    kwargs = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_completion_length=12,
        max_steps=2,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        beta=0.0,
        loss_type=loss_type,
        temperature=0.9,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        logging_steps=1,
        seed=7,
        gradient_checkpointing=False,
        disable_dropout=True,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_importance_sampling_mode=mode,
    )
    if loss_type == "luspo":
        kwargs["importance_sampling_level"] = "sequence"
    kwargs.update(overrides)
    ds = Dataset.from_list([{"prompt": p} for p in ["1+2=", "3+4=", "5+6=", "7+8="]])
    trainer = GRPOTrainer(
        model=model,
        args=GRPOConfig(**kwargs),
        reward_funcs=[reward_digits],
        train_dataset=ds,
        processing_class=tiny_tokenizer(),
    )
    no_grad_calls = []
    method = trainer._get_per_token_logps_and_entropies

    def counted(*args, **kw):
        if not torch.is_grad_enabled():
            no_grad_calls.append(1)
        return method(*args, **kw)

    trainer._get_per_token_logps_and_entropies = counted
    trainer.train()
    deltas = {n: p.detach() - before[n] for n, p in model.named_parameters() if p.requires_grad}
    logs = [h for h in trainer.state.log_history if "loss" in h]
    metrics = [{k: v for k, v in h.items() if k.startswith("sampling/")} for h in logs]
    return seen, deltas, [h["loss"] for h in logs], metrics, len(no_grad_calls)


def _same(got, ref, rtol: float) -> None:
    assert got[0] == ref[0], "different completions"
    assert any(d.abs().max() > 0 for d in ref[1].values()), "no update: the test would be vacuous"
    for name, d in ref[1].items():
        assert rel(got[1][name], d) <= rtol, f"{name}: relative error {rel(got[1][name], d):.2e}"


def parity(tmp_path, monkeypatch, lever_off_too: bool = False, **kw):
    """TRL alone, then patched (and, with ``lever_off_too``, patched without the lever) with the same fake vLLM;
    returns the no-grad call counts (TRL, slimrl)."""
    import trl.trainer.grpo_trainer as grpo_module

    monkeypatch.setattr(grpo_module, "VLLMGeneration", FakeVLLM)
    unpatch()
    ref = run(tmp_path / "trl", **kw)
    PatchFastRL("grpo")
    try:
        got = run(tmp_path / "slim", **kw)
        if lever_off_too:
            _same(got, run(tmp_path / "slim-off", **{**kw, "slimrl_reuse_old_logps": False}), 1e-4)
    finally:
        unpatch()
    _same(got, ref, 3e-4)
    assert got[2] == pytest.approx(ref[2], rel=1e-4, abs=1e-6)
    assert any(ref[3]), "TRL logged no IS metrics: the test would be vacuous"
    assert len(got[3]) == len(ref[3])
    for mine, theirs in zip(got[3], ref[3], strict=True):
        assert theirs.keys() <= mine.keys()
        if theirs:  # a generation batch was logged in this row
            assert set(MISMATCH) <= mine.keys(), "slimrl's sampler-trainer statistics are missing"
        for key, value in theirs.items():
            assert mine[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    return ref[4], got[4]


@pytest.mark.parametrize("mode", IS_MODES)
def test_every_is_mode_without_the_old_pass(tmp_path, monkeypatch, mode):
    trl_calls, slim_calls = parity(tmp_path, monkeypatch, lever_off_too=True, mode=mode)
    assert trl_calls == 2 and slim_calls == 0  # one old-log-prob pass per generation batch in TRL, none here


@pytest.mark.parametrize("loss_type", [t for t in grpo_loss_types() if t != "grpo"])
def test_every_loss_type_without_the_old_pass(tmp_path, monkeypatch, loss_type):
    mode = "token_truncate" if loss_type == "vespo" else "sequence_mask"  # TRL: vespo needs a token_* mode
    trl_calls, slim_calls = parity(tmp_path, monkeypatch, loss_type=loss_type, mode=mode, beta=0.04)
    assert trl_calls == 4 and slim_calls == 2  # old + reference in TRL; reference only here


def test_repeated_iterations_within_one_optimizer_step_reuse_too(tmp_path, monkeypatch):
    """num_iterations=2, steps_per_generation=1, accumulation 2: the batch is seen twice before the step."""
    trl_calls, slim_calls = parity(
        tmp_path, monkeypatch, num_iterations=2, steps_per_generation=1, per_device_train_batch_size=4
    )
    assert trl_calls == 2 and slim_calls == 0


def test_misaligned_generation_keeps_trls_pass(tmp_path, monkeypatch):
    """steps_per_generation=2 > accumulation 1: the second micro-batch follows an optimizer step, so the old
    log-probs differ from the policy's and TRL's pass must run."""
    trl_calls, slim_calls = parity(tmp_path, monkeypatch, gradient_accumulation_steps=1, steps_per_generation=2)
    assert trl_calls == slim_calls == 1


def test_the_lever_can_be_switched_off(tmp_path, monkeypatch):
    import trl.trainer.grpo_trainer as grpo_module

    monkeypatch.setattr(grpo_module, "VLLMGeneration", FakeVLLM)
    PatchFastRL("grpo")
    assert run(tmp_path / "off", slimrl_reuse_old_logps=False)[4] == 2
