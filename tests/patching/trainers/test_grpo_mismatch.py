"""The sampler-trainer mismatch: measured every generation batch, warned about with its cause, and corrected for
truncated sampling when asked (:mod:`slimrl.patching.online.mismatch`, :mod:`slimrl.patching.online.truncated_sampling`,
:mod:`slimrl.health.sampler`).

No vLLM in this venv: TRL's ``VLLMGeneration`` is replaced by :class:`ScriptedSampler`, which samples from the
trained model's own distribution (temperature, then vLLM's min_p/top_k/top_p filters, written here in fp64 loops:
``tests.ops.test_sampling_support.reference_kept``) and reports each sampled token's log-prob as vLLM's
``processed_logprobs`` does (renormalised over the kept tokens), minus a known shift per row. So the trainer's and
the sampler's log-probs differ by exactly ``shift + log S`` per token (``S`` the kept mass; up to fp32 rounding of
two forwards, ~1e-6), and the expected KL and masked shares follow in closed form.

Tolerances: KL and ratios relative 1e-3 (the shifts make per-token KL terms ~1e-2-0.3; the forwards agree to
~1e-6 per log-prob); masked shares exact (no sequence's ratio lies within 5 % of the cap).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from slimrl import PatchFastRL, unpatch
from tests.ops.test_sampling_support import reference_kept
from tests.patching.parity import tiny_model
from tests.tiny import tiny_tokenizer

TARGETS = ("q_proj", "v_proj")


class ScriptedSampler:
    """TRL's ``VLLMGeneration`` surface; see the module docstring. ``shifts[i % len]``: nats subtracted from row
    ``i``'s reported log-probs; ``stale``: sample from the model as it was built, before any update (a generator that
    never gets the trainer's updates; a fresh build, since a deep copy of the trainer's model would still call the
    trained one through the forward TRL binds to it)."""

    shifts = (0.0,)
    stale = False
    record: list = []

    def __init__(
        self,
        model=None,
        accelerator=None,
        processing_class=None,
        *,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        **kwargs,
    ):
        self.model, self.accelerator, self.temperature = model, accelerator, temperature
        self.filters = (top_k or 0, 1.0 if top_p is None else top_p, min_p or 0.0)
        self.calls, self.frozen = 0, None
        self.eos = processing_class.eos_token_id if processing_class is not None else 1

    def sync_weights(self) -> None:
        pass

    @torch.no_grad()
    def generate(self, prompts, images, num_generations, profiler=None):
        g = torch.Generator().manual_seed(200 + self.calls)
        self.calls += 1
        model = self.accelerator.unwrap_model(self.model)
        if self.stale:
            self.frozen = self.frozen or tiny_model(lora=True, targets=TARGETS)
            model = self.frozen
        completions, logprobs, batch = [], [], []
        for i, prompt in enumerate(prompts):
            n = 4 + (3 * i + self.calls) % 7  # 4..10 tokens, fewer where EOS is sampled
            ids, reported, log_s = list(prompt), [], []
            for _ in range(n):
                z = model(input_ids=torch.tensor([ids])).logits[0, -1].double() / self.temperature  # [V]
                kept = sorted(reference_kept(z.tolist(), *self.filters))
                logp = torch.log_softmax(z, -1)  # [V]
                mass = torch.logsumexp(logp[kept], 0)
                probs = torch.zeros_like(logp)
                probs[kept] = (logp[kept] - mass).exp()
                y = int(torch.multinomial(probs.float(), 1, generator=g))
                reported.append(float(logp[y] - mass) - self.shifts[i % len(self.shifts)])
                log_s.append(float(mass))
                ids.append(y)
                if y == self.eos:
                    break
            completions.append(ids[len(prompt) :])
            logprobs.append([[x] for x in reported])
            batch.append((self.shifts[i % len(self.shifts)], log_s))
        ScriptedSampler.record.append(batch)
        return prompts, completions, logprobs, [[[t] for t in c] for c in completions]


def train(tmp_path, monkeypatch, steps=1, shifts=(0.0,), stale=False, **overrides):
    """``steps`` GRPO steps, patched, with the scripted sampler; returns (trainer, the logged training rows)."""
    import trl.trainer.grpo_trainer as grpo_module
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setattr(grpo_module, "VLLMGeneration", ScriptedSampler)
    monkeypatch.setattr(ScriptedSampler, "shifts", shifts)
    monkeypatch.setattr(ScriptedSampler, "stale", stale)
    monkeypatch.setattr(ScriptedSampler, "record", [])
    kwargs = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        num_generations=4,
        max_completion_length=10,
        max_steps=steps,
        learning_rate=0.3,
        optim="sgd",
        lr_scheduler_type="constant",
        beta=0.0,
        temperature=0.9,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        logging_steps=1,
        seed=5,
        gradient_checkpointing=False,
        disable_dropout=True,
        use_vllm=True,
        vllm_mode="colocate",
    )
    kwargs.update(overrides)
    unpatch()
    PatchFastRL("grpo")
    try:
        ds = Dataset.from_list([{"prompt": p} for p in ["1+2=", "3+4=", "5+6=", "7+8="]])
        trainer = GRPOTrainer(
            model=tiny_model(lora=True, targets=TARGETS),
            args=GRPOConfig(**kwargs),
            reward_funcs=[lambda completions, **kw: [float(len(c)) for c in completions]],
            train_dataset=ds,
            processing_class=tiny_tokenizer(),
        )
        trainer.train()
    finally:
        unpatch()
    return trainer, [h for h in trainer.state.log_history if "loss" in h]


def expected(batch, mode="sequence_mask", cap=3.0, fixed=False):
    """(k3 mean, token share, sequence share, raw ratio mean) for one recorded generation batch: the per-token
    difference trainer - sampler is ``shift + log S`` (``shift`` alone once the fix renormalises)."""
    k3, tokens, masked_tok, masked_seq, ratios = 0.0, 0, 0, 0, []
    for shift, log_s in batch:
        d = [shift + (0.0 if fixed else s) for s in log_s]
        k3 += sum(math.expm1(x) - x for x in d)
        tokens += len(d)
        if mode.startswith("sequence"):
            r = math.exp(sum(d))
            ratios.append(r)
            masked_seq += r > cap
            masked_tok += len(d) * (r > cap)
        else:
            out = [math.exp(x) > cap for x in d]
            ratios += [math.exp(x) for x in d]
            masked_tok += sum(out)
            masked_seq += any(out)
    return k3 / tokens, masked_tok / tokens, masked_seq / len(batch), sum(ratios) / len(ratios)


@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("mode", ["sequence_mask", "token_mask"])
def test_a_known_shift_gives_the_expected_kl_and_masked_shares(tmp_path, monkeypatch, reuse, mode):
    shifts = (0.0, 0.02, 0.3, 1.5)  # per row: agreement, precision noise, a drift, a stale sampler
    _, rows = train(
        tmp_path, monkeypatch, shifts=shifts, vllm_importance_sampling_mode=mode, slimrl_reuse_old_logps=reuse
    )
    (batch,) = ScriptedSampler.record
    kl, tok, seq, raw = expected(batch, mode)
    assert seq > 0 and tok > 0, "nothing masked: the test would be vacuous"
    row = rows[0]
    assert row["sampling/kl_k3/mean"] == pytest.approx(kl, rel=1e-3)
    assert row["sampling/is_masked_share/token"] == tok
    assert row["sampling/is_masked_share/sequence"] == seq
    assert row["sampling/raw_importance_sampling_ratio/mean"] == pytest.approx(raw, rel=1e-3)
    assert row["sampling/kl_k3/max"] == pytest.approx(math.expm1(1.5) - 1.5, rel=1e-3)


@pytest.mark.parametrize("reuse", [True, False])
def test_the_fix_renormalises_over_the_kept_tokens_as_trl_1_17(tmp_path, monkeypatch, reuse):
    """top_k=6, top_p=0.8 over a 64-token vocabulary: without the fix the ratio carries ``S`` (the test's own
    kept mass); with it, exactly the shift remains: TRL 1.17's ``exp(log p(y) - log S - log p_vllm(y | K))``."""
    settings = dict(top_k=6, top_p=0.8, vllm_importance_sampling_mode="token_truncate", slimrl_reuse_old_logps=reuse)
    _, biased = train(tmp_path / "off", monkeypatch, shifts=(0.0, 0.1), **settings)
    kl, _, _, raw = expected(ScriptedSampler.record[0], "token_truncate")
    assert raw < 0.95, "nothing truncated: the test would be vacuous"
    assert biased[0]["sampling/raw_importance_sampling_ratio/mean"] == pytest.approx(raw, rel=1e-3)
    assert biased[0]["sampling/kl_k3/mean"] == pytest.approx(kl, rel=1e-3)
    _, fixed = train(tmp_path / "on", monkeypatch, shifts=(0.0, 0.1), slimrl_truncated_sampling_fix=True, **settings)
    kl, _, _, raw = expected(ScriptedSampler.record[0], "token_truncate", fixed=True)
    assert fixed[0]["sampling/raw_importance_sampling_ratio/mean"] == pytest.approx(raw, rel=1e-3)
    assert fixed[0]["sampling/kl_k3/mean"] == pytest.approx(kl, rel=1e-3)
    # TRL's own metrics read the corrected log-probs too: the largest |difference| is the largest shift
    assert fixed[0]["sampling/sampling_logp_difference/max"] == pytest.approx(0.1, rel=1e-3)
    assert fixed[0]["sampling/importance_sampling_ratio/mean"] == pytest.approx(raw, rel=1e-3)


def test_the_fix_is_off_by_default_and_a_no_op_without_truncation(tmp_path, monkeypatch):
    _, plain = train(tmp_path / "a", monkeypatch, shifts=(0.05,))
    _, fixed = train(tmp_path / "b", monkeypatch, shifts=(0.05,), slimrl_truncated_sampling_fix=True)
    for key in ("sampling/kl_k3/mean", "sampling/importance_sampling_ratio/mean", "loss"):
        assert fixed[0][key] == pytest.approx(plain[0][key], rel=1e-6)


def _health_warnings(caught) -> list[str]:
    from slimrl.health.monitor import RunHealthWarning

    return [
        str(w.message)
        for w in caught
        if issubclass(w.category, RunHealthWarning) and "generator disagrees" in str(w.message)
    ]


def test_truncated_sampling_is_warned_with_the_field_to_set(tmp_path, monkeypatch):
    settings = dict(top_k=3, steps=2, slimrl_health_window=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, rows = train(tmp_path / "off", monkeypatch, **settings)
    (message,) = _health_warnings(caught)
    assert "truncated sampling (top_k=3)" in message and "slimrl_truncated_sampling_fix=True" in message
    assert rows[-1]["health/sampler_mismatch"] == 1.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, rows = train(tmp_path / "on", monkeypatch, slimrl_truncated_sampling_fix=True, **settings)
    assert not _health_warnings(caught)
    assert rows[-1]["health/sampler_mismatch"] == 0.0


def test_a_generator_that_misses_the_updates_is_warned_as_not_synced(tmp_path, monkeypatch):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, rows = train(
            tmp_path,
            monkeypatch,
            stale=True,
            steps=4,
            learning_rate=3.0,
            slimrl_health_window=2,
            slimrl_health_mismatch_kl=1e-4,
        )
    assert rows[0]["sampling/kl_k3/mean"] < 1e-5  # before the first update the generator is the model
    assert rows[-1]["sampling/kl_k3/mean"] > 1e-4
    (message,) = _health_warnings(caught)
    assert "adapter is not synced" in message
