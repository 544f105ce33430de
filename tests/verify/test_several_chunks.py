"""``slimrl verify`` runs every code path it vouches for: its tiny runs' rows would fit one chunk of slimrl's op, so
the patched side is split in at least three (:func:`slimrl.verify.rows.several_chunks`). A bug past the first chunk
(+0.05 on the log-probs of every later row, the adversarial finding) fails the row; without the split it passed."""

from __future__ import annotations

import contextlib

import pytest

from slimrl.ops.chunked_logprob import ChunkedLogProb
from slimrl.verify import compare, make_setup
from slimrl.verify import rows as verify_rows


@pytest.fixture
def bug_past_the_first_chunk(monkeypatch):
    real = ChunkedLogProb._forward

    def buggy(ctx, dtype, hidden, weight, bias, targets, temperature, chunk_rows, *rest):
        out = real(ctx, dtype, hidden, weight, bias, targets, temperature, chunk_rows, *rest)
        out[0][chunk_rows:] += 0.05  # [N]: every row after the first chunk
        return out

    monkeypatch.setattr(ChunkedLogProb, "_forward", staticmethod(buggy))


@pytest.mark.parametrize("name", ["grpo", "orpo"])
def test_a_bug_past_the_first_chunk_fails_verify(bug_past_the_first_chunk, name):
    row = compare(name, "grpo" if name == "grpo" else "default", make_setup())
    assert not row.passed, row


def test_without_several_chunks_the_bug_would_pass(bug_past_the_first_chunk, monkeypatch):
    """What verify saw before: one chunk, the bug never reached."""
    monkeypatch.setattr(verify_rows, "several_chunks", contextlib.nullcontext)
    row = compare("orpo", "default", make_setup())
    assert row.passed, row


@pytest.fixture
def bug_past_the_first_micro_batch(monkeypatch):
    """+0.05 on the policy's log-probs of every forward after the first of a log-prob call."""
    import torch

    from slimrl.patching.online import logps
    from slimrl.patching.routes.head import Head

    forwards = [0]
    real_call, real_outputs, real_masked = logps.logps_and_entropies_through_ops, Head.outputs, Head.masked

    def call(*args, **kwargs):
        forwards[0] = 0
        return real_call(*args, **kwargs)

    def wrong(values):  # the policy's pass only: the same shift in the old and reference passes would cancel
        return values + 0.05 if forwards[0] > 1 and torch.is_grad_enabled() else values

    def outputs(self, *args, **kwargs):
        out = real_outputs(self, *args, **kwargs)
        forwards[0] += 1
        return (wrong(out[0]), *out[1:])

    def masked(self, *args, **kwargs):
        logps_, entropy = real_masked(self, *args, **kwargs)
        forwards[0] += 1
        return wrong(logps_), entropy

    monkeypatch.setattr(logps, "logps_and_entropies_through_ops", call)
    monkeypatch.setattr(Head, "outputs", outputs)
    monkeypatch.setattr(Head, "masked", masked)


def test_a_bug_past_the_first_micro_batch_fails_verify(bug_past_the_first_micro_batch):
    row = compare("grpo", "grpo", make_setup())
    assert not row.passed, row


def test_without_several_micro_batches_that_bug_would_pass(bug_past_the_first_micro_batch, monkeypatch):
    monkeypatch.setattr(verify_rows, "several_chunks", contextlib.nullcontext)
    row = compare("grpo", "grpo", make_setup())
    assert row.passed, row
