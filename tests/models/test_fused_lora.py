"""Fused LoRA (:mod:`slimrl.models.fused_lora`) against PEFT's layers, with an fp64 copy of PEFT's as the reference.

Layer shapes of Llama, Qwen2 (biased q/k/v), Qwen3, Mistral and Gemma 3 (tanh-GELU MLP): a LoRA projection and the
gated MLP, forward, input gradient and both adapter gradients of every projection.

Tolerances (relative, ``||ours - ref|| / ||ref||``):

* fp32: 1e-5 on a layer, 1e-4 through a whole two-layer model: the same products summed in another order (fp32's
  epsilon is 1.2e-7; a model's chain of layers amplifies it), and fused and PEFT within the same distance of each
  other. With dropout 0.1 both draw the same masks from the same seed, so the same bound holds.
* bf16: 2e-2 on a layer and at most twice PEFT's own error plus 2e-3: PEFT computes the adapters in fp32 beside a
  bf16 base, the fused path in bf16 with fp32 accumulation (bf16's epsilon 2^-8 = 3.9e-3, a few roundings deep).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from slimrl.models.fused_lora import fuse_lora, is_fused, unfuse_lora

FAMILIES = {  # model_type: the config keywords its tiny shape needs
    "llama": {},
    "qwen2": {},
    "qwen3": dict(head_dim=16),
    "mistral": {},
    "gemma3_text": dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8),
}


def _model(model_type: str, dtype=torch.float32, width: int = 32, **lora):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=49,
        max_position_embeddings=64,
        **FAMILIES[model_type],
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    torch.manual_seed(1)  # init_lora_weights=False: B is not zero, so every adapter gradient is
    lora = {"lora_alpha": 8, **lora}
    config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False, **lora)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_peft_model(model, config)


def _rel(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def _layer_run(module, x: torch.Tensor, grad: torch.Tensor, seed: int = 5) -> dict[str, torch.Tensor]:
    """Output, input gradient and every adapter gradient of ``module`` at ``x`` under the output gradient ``grad``."""
    module.zero_grad()
    x = x.detach().requires_grad_()
    torch.manual_seed(seed)
    out = module(x)
    out.backward(grad.to(out.dtype))
    found = {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.requires_grad}
    assert found and all(g.abs().sum() > 0 for g in found.values())
    return {"out": out.detach(), "dx": x.grad.detach(), **found}


def _worst(ours: dict, ref: dict) -> float:
    assert ours.keys() == ref.keys()
    return max(_rel(ours[k], ref[k]) for k in ref)


@pytest.mark.parametrize("model_type", list(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_each_familys_layers_match_peft_against_fp64(model_type, dtype):
    model = _model(model_type, dtype, width=64)
    layer = model.base_model.model.model.layers[0]
    parts = {"q_proj": layer.self_attn.q_proj, "o_proj": layer.self_attn.o_proj, "mlp": layer.mlp}
    if model_type == "qwen2":
        assert layer.self_attn.q_proj.base_layer.bias is not None  # the biased q/k/v served
    gen = torch.Generator().manual_seed(3)
    for name, module in parts.items():
        width = module.gate_proj.in_features if name == "mlp" else module.in_features
        x = torch.randn(2, 16, width, generator=gen).to(dtype)  # [B, T, in]
        out_width = module.down_proj.out_features if name == "mlp" else module.out_features
        grad = torch.randn(2, 16, out_width, generator=gen)  # [B, T, out]
        ref = _layer_run(copy.deepcopy(module).double(), x.double(), grad.double())
        theirs = _layer_run(module, x, grad)
        fuse_lora(module)
        assert is_fused(module)
        ours = _layer_run(module, x, grad)
        unfuse_lora(module)
        assert not is_fused(module) and _worst(_layer_run(module, x, grad), theirs) == 0.0
        if dtype == torch.float32:
            assert _worst(ours, ref) < 1e-5, name
        else:
            assert _worst(ours, ref) < min(2e-2, 2 * _worst(theirs, ref) + 2e-3), name


def _model_run(model, seed: int = 5) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 49, (2, 12), generator=torch.Generator().manual_seed(2))  # [B, T]
    model.train()
    model.zero_grad()
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_()  # [B, T, H]
    torch.manual_seed(seed)
    out = model(inputs_embeds=embeds, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return {"logits": out.logits.detach(), "dx": embeds.grad.detach(), **grads}


@pytest.mark.parametrize("model_type", list(FAMILIES))
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_whole_model_matches_peft_in_fp32(model_type, dropout):
    model = _model(model_type, lora_dropout=dropout)
    ref = _model_run(copy.deepcopy(model).double())
    theirs = _model_run(model)
    linears, mlps = fuse_lora(model)
    assert (linears, mlps) == (14, 2)  # 7 projections and 1 MLP a layer
    ours = _model_run(model)
    assert _worst(ours, ref) < 1e-4 and _worst(ours, theirs) < 1e-4
    assert _worst(theirs, ref) < 1e-4


def test_dropout_draws_peft_s_masks():
    """With dropout 0.5 a mask that differed would move the gradients by order one; the same masks give fp32's
    rounding only."""
    model = _model("llama", lora_dropout=0.5)
    theirs = _model_run(model, seed=11)
    fuse_lora(model)
    assert _worst(_model_run(model, seed=11), theirs) < 1e-5
    assert _worst(_model_run(model, seed=12), theirs) > 1e-2


def test_what_it_cannot_serve_runs_peft_s_forward():
    model = _model("llama")
    fuse_lora(model)
    ids = torch.randint(3, 49, (1, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        with model.disable_adapter():  # TRL's reference pass: the base model's numbers exactly
            disabled = model(input_ids=ids).logits
        twin = copy.deepcopy(model)
        unfuse_lora(twin)
        with twin.disable_adapter():
            assert torch.equal(disabled, twin(input_ids=ids).logits)
        fused = model(input_ids=ids).logits
        model.merge_adapter()  # merged: the base layer holds the adapter
        assert torch.allclose(model(input_ids=ids).logits, fused, rtol=1e-4, atol=1e-5)
        model.unmerge_adapter()


def test_dora_and_a_second_adapter_keep_peft_s_path():
    from peft import LoraConfig

    dora = _model("llama", use_dora=True)
    theirs = _model_run(dora)
    fuse_lora(dora)
    assert _worst(_model_run(dora), theirs) == 0.0  # every layer ran PEFT's own forward
    model = _model("llama")
    model.add_adapter("second", LoraConfig(r=2, target_modules="all-linear", init_lora_weights=False))
    model.base_model.set_adapter(["default", "second"])
    theirs = _model_run(model)
    fuse_lora(model)
    assert _worst(_model_run(model), theirs) == 0.0


def test_a_copy_computes_with_its_own_weights():
    model = _model("qwen2")
    fuse_lora(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            if p.requires_grad:
                p.mul_(2.0)
    ids = torch.randint(3, 49, (1, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert not torch.allclose(twin(input_ids=ids).logits, model(input_ids=ids).logits)
        unfuse_lora(twin)
        before = twin(input_ids=ids).logits
        fuse_lora(twin)
        assert torch.allclose(twin(input_ids=ids).logits, before, rtol=1e-5, atol=1e-6)


def test_an_mlp_of_another_shape_fails_the_probe():
    model = _model("llama")
    mlp = model.base_model.model.model.layers[0].mlp

    def swapped(self, x):  # down(gate(x) * act(up(x))): the gated names, another function
        return self.down_proj(self.gate_proj(x) * self.act_fn(self.up_proj(x)))

    import types

    mlp.forward = types.MethodType(swapped, mlp)
    with pytest.warns(UserWarning, match="PEFT runs it"):
        assert fuse_lora(model) == (14, 1)
    assert mlp.__dict__["forward"].__func__ is swapped


bnb = pytest.importorskip("bitsandbytes", minversion="0.50")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU backend of bitsandbytes")
def test_a_4bit_base_matches_peft(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from tests.tiny import tiny_llama

    tiny_llama(hidden_size=64, intermediate_size=128).save_pretrained(tmp_path)
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=quant)
    torch.manual_seed(1)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    theirs = _model_run(model)
    assert fuse_lora(model)[1] == 2
    assert _worst(_model_run(model), theirs) < 1e-5


@pytest.mark.parametrize("tiled_first", [True, False])
def test_tiles_stay_outside_the_fused_mlp(tiled_first):
    from slimrl.models.fused_lora import fused_mlp_forward
    from slimrl.models.tiled_mlp import tile_mlp, tiled_forward, untile_mlp

    model = _model("llama")
    theirs = _model_run(model)
    steps = [lambda: tile_mlp(model, rows=5), lambda: fuse_lora(model)]
    for step in steps if tiled_first else steps[::-1]:
        step()
    mlp = model.base_model.model.model.layers[0].mlp
    assert vars(mlp)["forward"].__func__ is tiled_forward
    assert vars(mlp)["slimrl_inner_forward"].__func__ is fused_mlp_forward
    assert _worst(_model_run(model), theirs) < 1e-5  # 24 rows in tiles of 5, each through the fused MLP
    unfuse_lora(model)
    assert vars(mlp)["forward"].__func__ is tiled_forward and not is_fused(model)
    untile_mlp(model)
    assert "forward" not in vars(mlp) and _worst(_model_run(model), theirs) == 0.0


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("alpha", [8, 6])  # scale 2 (moved onto B) and 1.5
def test_a_lora_projection_is_peft_s_bit_for_bit_in_16_bits(autocast, alpha):
    """A bf16 base with PEFT's fp32 adapters, with and without autocast (a mixed-precision run): the fused projection
    computes in PEFT's dtypes and rounds in PEFT's order, so output, input gradient and adapter gradients are equal.
    (A one-ulp difference in every projection grows into percents of a 16-bit model's gradients.)"""
    model = _model("qwen2", torch.bfloat16, width=64, lora_alpha=alpha)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj  # biased (Qwen2)
    assert layer.lora_A["default"].weight.dtype == torch.float32
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 64, generator=gen).to(torch.bfloat16)
    grad = torch.randn(2, 16, layer.out_features, generator=gen)

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return _layer_run(layer, x, grad)

    theirs = run()
    fuse_lora(layer)
    assert _worst(run(), theirs) == 0.0
