"""A 16-bit verify row (every row on CUDA) trains the patched side on the completions TRL alone sampled: a token that
bf16 rounding flips in the patched generation is no failure of slimrl's. Shown on this CPU in bf16."""

from __future__ import annotations

import dataclasses

import torch

from slimrl.verify import compare, make_setup
from slimrl.verify.replay import replays


def _flip_one_sampled_token(monkeypatch):
    """The patched run's generator samples one token differently from TRL alone's (what bf16 rounding can do)."""
    from transformers import GenerationMixin

    from slimrl.patching.machinery.registry import _INSTALLED

    real = GenerationMixin.generate

    def generate(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if _INSTALLED:  # the patched side
            seqs = out.sequences if hasattr(out, "sequences") else out
            seqs[0, -1] = (seqs[0, -1] + 1) % self.config.vocab_size
        return out

    monkeypatch.setattr(GenerationMixin, "generate", generate)


def test_a_flipped_token_fails_an_fp32_row_and_passes_a_bf16_one(monkeypatch):
    assert replays(torch.bfloat16, "cpu") and replays(torch.float32, "cuda") and not replays(torch.float32, "cpu")
    _flip_one_sampled_token(monkeypatch)
    fp32 = compare("grpo", "grpo", make_setup())
    assert fp32.failed, "fp32 rows compare generation too: a different sample must show"
    bf16 = dataclasses.replace(make_setup(), dtype=torch.bfloat16)
    row = compare("grpo", "grpo", bf16)
    assert row.passed, row
    from slimrl.verify import rows

    monkeypatch.setattr(rows, "replays", lambda dtype, device: False)
    assert compare("grpo", "grpo", bf16).failed, "without the replay the flipped token must fail the row"
