"""slimrl.ops.sampling_support against an fp64 reference written as plain loops over each row, and each filter alone
against transformers' own logits warpers (an implementation slimrl did not write).

Tolerances: the kept sets must be equal (logits are drawn continuous, so no token sits on a cutoff within fp32
rounding); ``log S`` at 1e-5 absolute (fp32 logsumexp over V = 97 terms against fp64).
"""

from __future__ import annotations

import math

import pytest
import torch

from slimrl.ops.sampling_support import kept_support, log_kept_mass, truncates


def reference_kept(z: list[float], top_k: int, top_p: float, min_p: float) -> set[int]:
    """vLLM's order (min_p, top_k, top_p), one row, fp64 Python floats."""
    peak = max(z)
    probs = [math.exp(v - peak) for v in z]
    total = sum(probs)
    probs = [p / total for p in probs]
    kept = set(range(len(z)))
    if min_p > 0:
        kept = {v for v in kept if probs[v] >= min_p * max(probs)}
    if 0 < top_k < len(z):
        kth = sorted((z[v] for v in kept), reverse=True)[min(top_k, len(kept)) - 1]
        kept = {v for v in kept if z[v] >= kth}
    if top_p < 1:
        mass = sum(probs[v] for v in kept)
        ascending = sorted(kept, key=lambda v: probs[v])
        cumulative, dropped = 0.0, set()
        for v in ascending[:-1]:
            cumulative += probs[v] / mass
            if cumulative <= 1 - top_p:
                dropped.add(v)
        kept -= dropped
    return kept


SETTINGS = [
    (0, 1.0, 0.0),
    (5, 1.0, 0.0),
    (0, 0.8, 0.0),
    (0, 1.0, 0.1),
    (20, 0.9, 0.0),
    (40, 0.7, 0.05),
    (1, 1.0, 0.0),
    (0, 0.05, 0.0),
]


@pytest.mark.parametrize("top_k,top_p,min_p", SETTINGS)
def test_kept_support_and_mass_match_the_fp64_reference(top_k, top_p, min_p):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 97, generator=g) * 3  # [N, V]
    temperature = 0.7
    keep = kept_support(logits / temperature, top_k, top_p, min_p)
    got = log_kept_mass(logits, temperature, top_k, top_p, min_p)
    z64 = logits.double() / temperature
    for row in range(logits.size(0)):
        ref = reference_kept(z64[row].tolist(), top_k, top_p, min_p)
        assert set(torch.nonzero(keep[row]).flatten().tolist()) == ref, row
        logp = torch.log_softmax(z64[row], -1)
        expected = torch.logsumexp(logp[sorted(ref)], 0).item()
        assert got[row].item() == pytest.approx(expected, abs=1e-5)
    if not truncates(top_k, top_p, min_p):
        assert got.abs().max() < 1e-6  # nothing cut: S = 1
    else:
        assert got.max() < 0  # something was cut in some row: S < 1 there


@pytest.mark.parametrize("which", ["top_k", "top_p", "min_p"])
def test_each_filter_alone_keeps_what_transformers_keeps(which):
    from transformers.generation.logits_process import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(11)
    z = torch.randn(8, 61, generator=g).double() * 2  # [N, V]
    warper, kwargs = {
        "top_k": (TopKLogitsWarper(7), {"top_k": 7}),
        "top_p": (TopPLogitsWarper(0.75), {"top_p": 0.75}),
        "min_p": (MinPLogitsWarper(0.08), {"min_p": 0.08}),
    }[which]
    theirs = torch.isfinite(warper(None, z.clone()))
    assert torch.equal(kept_support(z, **kwargs), theirs)


def test_truncates():
    assert not truncates(0, 1.0, 0.0) and not truncates(-1, 1.0, None) and not truncates(None, None, None)
    assert truncates(50, 1.0, 0.0) and truncates(0, 0.95, 0.0) and truncates(0, 1.0, 0.1)
