"""Length-grouped log-prob forwards (:func:`slimrl.patching.routes.method_capture.length_groups`): rows sorted by
completion length, cut into forwards within a token budget, trailing padding cut; same log-probs, entropies and
gradients as TRL's full-width batches.

Tolerance: relative 1e-5 between slimrl with and without grouping (same op; a forward over fewer columns and
other rows changes only the GEMM blocking, measured ~1e-7), 1e-4 against TRL alone (its head sums the vocabulary
in another order).
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from slimrl import PatchFastRL, unpatch
from slimrl.patching.routes.method_capture import length_groups
from tests.patching.parity import rel
from tests.tiny import CPU_ARGS, tiny_llama, tiny_tokenizer


def _cost(groups, lengths, prompt, forward_cost):
    return sum(len(g) * (prompt + max(max(lengths[i] for i in g), 1)) + forward_cost for g in groups)


@pytest.mark.parametrize("n", [1, 5, 40, 300])
def test_groups_cover_every_row_once_within_the_budget(n):
    rng = random.Random(n)
    lengths = [rng.randint(0, 512) for _ in range(n)]
    budget = 8 * 600
    groups = length_groups(lengths, prompt_width=30, budget=budget, forward_cost=16)
    assert sorted(i for g in groups for i in g) == list(range(n))
    for g in groups:
        width = 30 + max(1, max(lengths[i] for i in g))
        assert len(g) == 1 or len(g) * width <= budget
    if n > 1:
        assert _cost(groups, lengths, 30, 16) < n * (30 + max(lengths)) + 16 * len(groups)  # padding was cut


def test_the_programme_finds_the_cheapest_cut_of_the_sorted_rows():
    """Against every way to cut the sorted rows into consecutive groups (brute force)."""
    rng = random.Random(0)
    for _ in range(30):
        n = rng.randint(1, 7)
        lengths = [rng.randint(0, 100) for _ in range(n)]
        prompt, budget, cost = rng.randint(0, 20), rng.randint(50, 400), rng.choice([0, 16, 200])
        order = sorted(range(n), key=lambda i: -lengths[i])
        best = float("inf")
        for cuts in itertools.product([0, 1], repeat=n - 1):
            groups, start = [], 0
            for k, c in enumerate(cuts, 1):
                if c:
                    groups.append(order[start:k])
                    start = k
            groups.append(order[start:])
            if all(len(g) == 1 or len(g) * (prompt + max(1, lengths[g[0]])) <= budget for g in groups):
                best = min(best, _cost(groups, lengths, prompt, cost))
        got = length_groups(lengths, prompt, budget, cost)
        assert _cost(got, lengths, prompt, cost) == best


def _trainer(tmp_path, **cfg):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model = tiny_llama(seed=0)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=40,
        gradient_checkpointing=False,
        **CPU_ARGS,
        **cfg,
    )
    ds = Dataset.from_list([{"prompt": "1+2="}] * 4)
    return GRPOTrainer(
        model=model,
        args=args,
        reward_funcs=[lambda completions, **k: [0.0] * len(completions)],
        train_dataset=ds,
        processing_class=tiny_tokenizer(),
    )


def _batch(rows=12, prompt=6, completion=40):
    """Left-padded prompts of 2..6 tokens, right-padded completions of 1..40 tokens (some empty)."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 49, (rows, prompt + completion), generator=g)
    mask = torch.ones_like(ids)
    for r in range(rows):
        p_len = 2 + r % 5
        c_len = 0 if r == 5 else 1 + (7 * r) % completion
        mask[r, : prompt - p_len] = 0
        mask[r, prompt + c_len :] = 0
        ids[r, prompt + c_len :] = 0
    return ids, mask


def _logps_and_grads(trainer, ids, mask, completion, batch_size, entropy_grad=True):
    """Log-probs, entropies (at real positions) and the gradients of a weighted sum of both; ``entropy_grad=False``
    where TRL's own entropies carry no gradient (TRL 1.12: entropies are only a metric and a mask there)."""
    model = trainer.model
    model.zero_grad(set_to_none=True)
    logps, ent, _ = trainer._get_per_token_logps_and_entropies(
        model, ids, mask, completion, batch_size=batch_size, compute_entropy=True
    )
    valid = mask[:, -completion:].bool()
    w = torch.linspace(-1, 1, valid.numel()).view_as(valid)
    ent_term = ent if entropy_grad else ent.detach()
    ((logps * w)[valid].sum() + (ent_term * w.flip(0))[valid].sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps.detach() * valid, ent.detach() * valid, grads


@pytest.mark.parametrize("batch_size", [None, 4])  # the policy forward (all rows) and the no-grad passes' batches
def test_grouped_forwards_equal_trls_full_width_batches(tmp_path, batch_size):
    trainer = _trainer(tmp_path)
    ids, mask = _batch()
    unpatch()
    probe = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 40, compute_entropy=True)[1]
    entropy_grad = probe.requires_grad  # TRL's entropies: differentiable (1.16) or a detached metric (1.12)
    ref = _logps_and_grads(trainer, ids, mask, 40, batch_size, entropy_grad)
    PatchFastRL("grpo")
    calls = []
    import slimrl.patching.routes.method_capture as mc

    orig = mc.length_groups
    mc.length_groups = lambda *a: calls.append(orig(*a)) or calls[-1]
    try:
        grouped = _logps_and_grads(trainer, ids, mask, 40, batch_size, entropy_grad)
    finally:
        mc.length_groups = orig
    trainer.args.slimrl_length_groups = False
    full = _logps_and_grads(trainer, ids, mask, 40, batch_size, entropy_grad)
    assert len(calls[0]) > 1, "one group: the test would not exercise the cut"
    for mine, name in ((grouped, "grouped"), (full, "full width")):
        assert rel(mine[0], ref[0]) <= 1e-4 and rel(mine[1], ref[1]) <= 1e-4, name
        for key, g in ref[2].items():
            assert rel(mine[2][key], g) <= 1e-4, (name, key)
    assert rel(grouped[0], full[0]) <= 1e-5 and rel(grouped[1], full[1]) <= 1e-5
    for key, g in full[2].items():
        assert rel(grouped[2][key], g) <= 1e-5, key


def test_token_budget_bounds_every_forward(tmp_path):
    PatchFastRL("grpo")
    trainer = _trainer(tmp_path, slimrl_token_budget=90)
    ids, mask = _batch()
    widths = []
    model = trainer.model
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: widths.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        with torch.no_grad():
            trainer._get_per_token_logps_and_entropies(model, ids, mask, 40, batch_size=12)
    finally:
        hook.remove()
    assert len(widths) > 2 and any(rows > 1 for rows, _ in widths)
    assert all(rows * width <= 90 or rows == 1 for rows, width in widths)  # one row may exceed a tiny budget
