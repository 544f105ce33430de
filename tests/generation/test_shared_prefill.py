"""Generation's prefill once per distinct prompt (:mod:`slimrl.generation.shared_prefill`) against transformers'
own ``generate`` on the same model and inputs: the same tokens under greedy decoding, and under sampling (same seed)
the same tokens and the same per-step logits; the prefill runs over the distinct prompts only.

Tolerance: per-step logits within 1e-5 absolute (fp32; the prefill's matmuls run over fewer rows, a different
summation blocking, ~1e-7 relative per op over 2 layers and 8 steps). The GRPO trainer's use (TRL alone vs patched,
same sampled completions, losses and updates) is in tests/patching/routes/test_shared_prefix.py."""

from __future__ import annotations

import logging

import pytest
import torch

from slimrl.generation import shared_prefill
from tests.patching.routes.test_shared_prefix import _model

PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [20, 21, 22, 23, 24, 25, 26], [30]]  # four lengths: four left paddings


def _batch(repeat: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Each prompt ``repeat`` times in a row (GRPO's order), left-padded with 0: ``[4 * repeat, 7]`` ids and mask."""
    width = max(map(len, PROMPTS))
    rows = [p for p in PROMPTS for _ in range(repeat)]
    ids = torch.tensor([[0] * (width - len(p)) + p for p in rows])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
    return ids, mask


def _generate(model, sample: bool, shared: bool, ids, mask, **config):
    from transformers import GenerationConfig

    gen = GenerationConfig(
        max_new_tokens=8,
        do_sample=sample,
        temperature=0.9 if sample else None,
        top_k=0,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
        eos_token_id=None,
        **config,
    )
    generate = shared_prefill.shared_prefill_generate(model.generate, model) if shared else model.generate
    torch.manual_seed(3)
    with torch.no_grad():
        return generate(input_ids=ids, attention_mask=mask, generation_config=gen)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3_text"])
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_same_tokens_and_logits_as_transformers_generate(family, sample):
    model = _model(family).eval()
    ids, mask = _batch()
    ref = _generate(model, sample, False, ids, mask)
    got = _generate(model, sample, True, ids, mask)
    assert torch.equal(got.sequences, ref.sequences)
    assert len(got.logits) == len(ref.logits) == 8
    for step, (a, b) in enumerate(zip(got.logits, ref.logits, strict=True)):
        assert (a - b).abs().max().item() <= 1e-5, step
    if sample:  # the sampled rows differ within a group: a real sampling test, not four copies of one row
        assert len({tuple(r) for r in ref.sequences[:4, ids.size(1) :].tolist()}) > 1


def test_the_prefill_runs_over_distinct_prompts_once():
    """The embedding sees the 4 distinct prompts' first P - 1 tokens once, then one token per row per step."""
    model = _model("llama").eval()
    ids, mask = _batch(repeat=4)
    shapes = []
    handle = model.get_input_embeddings().register_forward_hook(lambda m, a, out: shapes.append(tuple(a[0].shape)))
    try:
        _generate(model, True, True, ids, mask)
    finally:
        handle.remove()
    assert shapes[0] == (4, ids.size(1) - 1) and shapes[1:] == [(16, 1)] * 8, shapes


def test_distinct_rows_keeps_first_seen_order():
    ids = torch.tensor([[0, 3], [0, 3], [4, 5], [0, 3], [4, 5]])
    mask = torch.tensor([[0, 1], [0, 1], [1, 1], [0, 1], [1, 1]])
    rows, inverse = shared_prefill.distinct_rows(ids, mask)
    assert rows.tolist() == [0, 2] and inverse.tolist() == [0, 0, 1, 0, 1]
    same_ids_other_mask = shared_prefill.distinct_rows(torch.tensor([[0, 3], [0, 3]]), torch.tensor([[0, 1], [1, 1]]))
    assert same_ids_other_mask[0].tolist() == [0, 1]


@pytest.mark.parametrize(
    "case,expected",
    [
        ("training", "a module in training mode with attention_dropout=0.1"),
        ("beams", "beam search"),
        ("static", "a cache implementation or chunked prefill is set"),
        ("images", "other inputs than prompt ids and mask"),
        ("no cache", "generation without a KV cache"),
        ("model says no cache", "generation without a KV cache"),
    ],
)
def test_what_it_cannot_serve_runs_transformers_generate_with_one_line(caplog, case, expected):
    model = _model("llama").eval()
    ids, mask = _batch(repeat=2)
    calls = []

    def recording_generate(**kwargs):
        calls.append(kwargs)
        return "sequences"

    kwargs = {"input_ids": ids, "attention_mask": mask, "generation_config": None}
    if case == "training":
        model = _model("llama", attention_dropout=0.1).train()
    elif case == "beams":
        from transformers import GenerationConfig

        kwargs["generation_config"] = GenerationConfig(num_beams=2)
    elif case == "static":
        from transformers import GenerationConfig

        kwargs["generation_config"] = GenerationConfig(cache_implementation="static")
    elif case == "images":
        kwargs["pixel_values"] = torch.zeros(1)
    elif case == "no cache":
        from transformers import GenerationConfig

        kwargs["generation_config"] = GenerationConfig(use_cache=False)
    else:  # the call's config leaves it to the model's (TRL's GRPO sets the model's off with checkpointing)
        model.generation_config.use_cache = False
    shared_prefill._SAID.clear()
    generate = shared_prefill.shared_prefill_generate(recording_generate, model)
    with caplog.at_level(logging.INFO, logger="slimrl"):
        assert generate(**kwargs) == "sequences" and generate(**kwargs) == "sequences"
    assert [set(c) for c in calls] == [set(kwargs)] * 2  # TRL's call, unchanged (no cache handed in)
    lines = [r.getMessage() for r in caplog.records if "shared prefill off" in r.getMessage()]
    assert len(lines) == 1 and expected in lines[0], lines


def test_no_repeated_prompt_runs_unchanged_and_silently(caplog):
    model = _model("llama").eval()
    ids, mask = _batch(repeat=1)
    with caplog.at_level(logging.INFO, logger="slimrl"):
        got = _generate(model, False, True, ids, mask)
    assert torch.equal(got.sequences, _generate(model, False, False, ids, mask).sequences)
    assert not [r for r in caplog.records if "shared prefill" in r.getMessage()]


def test_training_mode_without_random_draws_is_shared():
    """TRL's RLOO generates with the model in training mode: with nothing that draws (dropout 0) the forward is the
    eval-mode one, so the prefill is shared and the tokens and logits are transformers' own; a dropout module with
    p > 0 anywhere keeps TRL's prefill (the parametrized fallback test above)."""
    model = _model("llama").train()
    ids, mask = _batch()
    ref = _generate(model, True, False, ids, mask)
    calls = []
    handle = model.get_input_embeddings().register_forward_hook(lambda m, a, out: calls.append(a[0].size(0)))
    try:
        got = _generate(model, True, True, ids, mask)
    finally:
        handle.remove()
    assert calls[0] == len(PROMPTS), "the prefill did not run once per distinct prompt"
    assert torch.equal(got.sequences, ref.sequences)
    assert max((a - b).abs().max().item() for a, b in zip(got.logits, ref.logits, strict=True)) <= 1e-5
