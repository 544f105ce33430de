"""The sampler-mismatch check on synthetic log histories: silent until the metric is logged, quiet under its limits,
and naming the likeliest cause when it holds (:mod:`slimrl.health.sampler`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slimrl.health.checks import CHECKS, Thresholds
from slimrl.health.sampler import SamplerFacts, sampler_mismatch


def rows(kl, masked=None, ratio=None):
    masked = masked or [0.0] * len(kl)
    ratio = ratio or [1.0] * len(kl)
    return [
        {
            "step": i + 1,
            "loss": 0.1,
            "sampling/kl_k3/mean": k,
            "sampling/is_masked_share/sequence": m,
            "sampling/raw_importance_sampling_ratio/mean": r,
        }
        for i, (k, m, r) in enumerate(zip(kl, masked, ratio, strict=True))
    ]


def t(**facts):
    return Thresholds(
        window=2, mismatch_kl=0.005, mismatch_masked=0.1, mismatch_ratio=0.2, sampler=SamplerFacts(**facts)
    )


def test_registered_and_silent_until_logged():
    assert CHECKS["sampler_mismatch"] is sampler_mismatch
    assert sampler_mismatch([{"step": 1, "loss": 0.1}] * 3, t()) is None
    assert sampler_mismatch(rows([0.001, 0.002, 0.001]), t()) == (False, "")


def test_a_jump_after_the_first_step_is_an_adapter_not_synced():
    holds, message = sampler_mismatch(rows([1e-5, 0.01, 0.02]), t(truncation="top_p=0.8", biased_ratio=True))
    assert holds and "adapter is not synced" in message and "0.015" in message


def test_truncated_sampling_on_a_biased_release_names_the_field():
    holds, message = sampler_mismatch(
        rows([0.006, 0.006, 0.007]), t(truncation="top_p=0.8", biased_ratio=True, trl="1.16.0")
    )
    assert holds and "truncated sampling (top_p=0.8)" in message and "slimrl_truncated_sampling_fix=True" in message


@pytest.mark.parametrize("kl, masked", [([0.01, 0.01, 0.012], None), ([0.001] * 3, [0.3, 0.2, 0.4])])
def test_otherwise_precision(kl, masked):
    holds, message = sampler_mismatch(rows(kl, masked), t(trainer_precision="fp32"))
    assert holds and "likely cause: precision" in message and "(fp32)" in message


def test_facts_from_a_config():
    args = SimpleNamespace(
        top_p=1.0, top_k=0, min_p=0.0, generation_kwargs={"top_k": 20}, bf16=True, vllm_sampling_params=None
    )
    facts = SamplerFacts.from_args(args)
    assert facts.truncation == "top_k=20" and facts.trainer_precision == "bf16" and facts.biased_ratio
    assert not SamplerFacts.from_args(args, fix=True).biased_ratio  # slimrl_truncated_sampling_fix, read upstream
    assert SamplerFacts.from_args(SimpleNamespace(top_p=1.0, top_k=0, min_p=0.0)).truncation == ""


def test_sequences_weighted_towards_zero_hold_without_being_masked():
    """bench/mismatch.py's fp32 top_p=0.8 rows: KL 1.9e-3-3.6e-3 (under the KL limit), nothing masked (the default
    mode masks only above its cap), mean sequence ratio 0.41-0.57: the bias down-weights every sequence."""
    history = rows([0.002, 0.002, 0.002], ratio=[0.5, 0.45, 0.6])
    holds, message = sampler_mismatch(history, t(truncation="top_p=0.8", biased_ratio=True, trl="1.16.0"))
    assert holds and "mean ratio 0.525" in message and "truncated sampling (top_p=0.8)" in message
    assert sampler_mismatch(rows([0.0015] * 3, ratio=[1.06, 1.01, 0.91]), t()) == (False, "")  # bf16 noise


def test_a_collapsed_ratio_under_truncated_sampling_is_named_at_its_first_step():
    """min_p / top_p on TRL < 1.17 without the fix: a ratio of 0.001 (Unsloth's notebooks' logs) is named from the
    first logged step, not after a window; the same ratio without truncated sampling waits for the window."""
    collapsed = rows([0.5], ratio=[0.001])
    holds, message = sampler_mismatch(collapsed, t(truncation="min_p=0.1", biased_ratio=True, trl="1.16.0"))
    assert holds and "collapsed at step 1" in message and "slimrl_truncated_sampling_fix=True" in message
    assert sampler_mismatch(collapsed, t(trainer_precision="fp32")) is None  # window of 2 not filled
    assert sampler_mismatch(rows([0.001], ratio=[0.5]), t(truncation="min_p=0.1", biased_ratio=True)) is None
