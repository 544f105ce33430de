"""Tiled MLP (``unsloth_tiled_mlp``): the same outputs and gradients as the whole-batch MLP, less memory in the
backward's recompute, reversible, and Unsloth's keyword honoured."""

from __future__ import annotations

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.models.tiled_mlp import is_tiled, tile_mlp, tiled_modules, untile_mlp
from tests.tiny import tiny_llama


def test_tiles_equal_the_fp64_mlp():
    """fp64, forward and every gradient against the untiled module: 1e-12 (the same products, summed per tile)."""
    model = tiny_llama().double()
    mlp = tiled_modules(model)[0]
    x = torch.randn(3, 37, 32, dtype=torch.float64, requires_grad=True)  # [B, T, H]; 111 rows, tiles of 16
    want = mlp(x)
    want_grads = torch.autograd.grad(want.square().sum(), [x, *mlp.parameters()])
    assert tile_mlp(model, rows=16) == 2 and is_tiled(model)
    got = mlp(x)
    got_grads = torch.autograd.grad(got.square().sum(), [x, *mlp.parameters()])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    untile_mlp(model)
    assert not is_tiled(model) and "forward" not in vars(mlp)


def _loss_and_grads(model_dir, tiled):
    model, _ = FastLanguageModel.from_pretrained(str(model_dir), unsloth_tiled_mlp=tiled)
    model = FastLanguageModel.get_peft_model(model, r=4, use_gradient_checkpointing="slimrl", init_lora_weights=False)
    model.train()
    ids = torch.randint(0, 49, (3, 29), generator=torch.Generator().manual_seed(0))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return model, loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def test_keyword_tiles_and_training_matches_untiled(tiny_model_dir):
    """LoRA under slimrl's checkpointing (a checkpoint per tile inside the layer's): loss and every LoRA gradient
    equal to fp32 rounding (1e-6: the tiles' partial sums are added in another order)."""
    _, loss, ref = _loss_and_grads(tiny_model_dir, False)
    model, got_loss, got = _loss_and_grads(tiny_model_dir, 8)  # 87 rows: 11 tiles per layer
    assert is_tiled(model) and all(m.slimrl_tiled_rows == 8 for m in tiled_modules(model))
    torch.testing.assert_close(got_loss, loss, rtol=1e-6, atol=1e-7)
    assert ref.keys() == got.keys()
    for name, g in ref.items():
        torch.testing.assert_close(got[name], g, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("bad", ["yes", -1, 1.5])
def test_bad_value_is_one_clear_error(tiny_model_dir, bad):
    with pytest.raises(ValueError, match="unsloth_tiled_mlp"):
        FastLanguageModel.from_pretrained(str(tiny_model_dir), unsloth_tiled_mlp=bad)


def test_the_backward_recompute_holds_one_tile_of_intermediates():
    """On the meta device (slimrl plan's trace): a wide MLP's checkpointed log-prob pass over 4,096 tokens peaks
    lower with tiles of 256, by most of the [tokens, intermediate] tensors the whole-batch recompute holds."""
    from slimrl.planning.trace import meta_model, trace_logprob_pass

    config = tiny_llama(hidden_size=64, intermediate_size=1024).config

    def peak(tiled: bool) -> int:
        model = meta_model(config, torch.float32, lora_r=4, checkpoint_every=1)
        if tiled:
            assert tile_mlp(model, rows=256) == config.num_hidden_layers
        return trace_logprob_pass(model, 1, 1, 4095, grad=True, entropy=False, chunk_rows=512)[1]

    whole, tiles = peak(False), peak(True)
    intermediates = 4096 * 1024 * 4 * 3  # gate, up, their product: fp32, what the whole-batch recompute keeps
    assert tiles < whole - intermediates // 2, (whole, tiles)


def test_a_deep_copy_computes_with_its_own_weights():
    """TRL's frozen reference is ``copy.deepcopy(policy)`` (``create_reference_model``: Online DPO, A2PO in full
    fine-tuning): the copy's tiled MLPs run the copy's weights, not the policy's as they change."""
    import copy

    model = tiny_llama()
    tile_mlp(model, rows=8)
    reference = copy.deepcopy(model)
    untiled = copy.deepcopy(model)
    untile_mlp(untiled)
    with torch.no_grad():
        for p in tiled_modules(model)[0].parameters():
            p.add_(0.5)  # the policy moves
    x = torch.randn(2, 13, 32)  # [B, T, H]: 26 rows, tiles of 8
    ref_mlp, untiled_mlp, policy_mlp = (tiled_modules(m)[0] for m in (reference, untiled, model))
    with torch.no_grad():
        torch.testing.assert_close(ref_mlp(x), untiled_mlp(x), rtol=0, atol=1e-6)
        assert (ref_mlp(x) - policy_mlp(x)).abs().max() > 0.1


def test_an_mlp_that_is_not_position_wise_stands_aside():
    class PairMLP(torch.nn.Module):  # returns (output, aux): not one row per row
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.proj(x), x.mean()

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = PairMLP()

    holder = Holder()
    assert tile_mlp(holder, rows=2) == 1
    x = torch.randn(1, 5, 4)
    with pytest.warns(UserWarning, match=r"PairMLP returns tuple for a tile of 2 rows.*it runs untiled"):
        out, aux = holder.mlp(x)
    assert out.shape == (1, 5, 4) and not is_tiled(holder)
    torch.testing.assert_close(holder.mlp(x)[0], holder.mlp.proj(x))


def test_an_mlp_that_mixes_positions_is_found_by_the_probe_and_left_untiled():
    """Round 7: a module named like an MLP that mixes rows (here: centred over the tokens) computed other numbers
    tiled; the probe before tiling finds it, one line, and the model computes as it did."""

    class MixMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.proj(x - x.mean(dim=-2, keepdim=True))

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = MixMLP()

    holder = Holder()
    x = torch.randn(1, 6, 4)
    before = holder.mlp(x)
    with pytest.warns(UserWarning, match=r"MixMLP does not compute each row on its own.*it runs untiled"):
        assert tile_mlp(holder, rows=2) == 0
    assert not is_tiled(holder)
    torch.testing.assert_close(holder.mlp(x), before)
