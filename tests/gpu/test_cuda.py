"""CUDA tests (``make test-gpu``; skipped where there is no CUDA device).

* the op against fp64 on CUDA: fp32 inputs at rtol/atol 1e-5 elementwise (no TF32: torch's default fp32 matmul
  precision is "highest"); bf16 as a norm-wise relative error of 2e-2, about five bf16 epsilons (8 mantissa bits,
  softmax in fp32): elementwise, a gradient element that cancels to near zero carries the rounding of its O(1)
  summands (seen on an H200: 0.052 absolute against 3e-2, the same element and value as on a CPU; norm-wise 8.4e-3);
* GRPO patched vs unpatched on CUDA (fp32, relative 1e-4 on the LoRA updates, as on CPU);
* a QLoRA (NF4) GRPO step; 4-bit LoRA gradients after for_inference -> generate -> for_training equal a fresh
  copy's (fp32 compute, 1e-5 relative: same weights and batch on both sides; tests/models/test_quantized.py on CPU);
* fp16 with loss scaling: an inf-gradient step is the scaler's to skip, slimrl's guard does not stop it;
* the precision defaults stay TRL's on CUDA;
* offloaded activation checkpointing: same gradients as GPU-resident checkpointing, less peak memory.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from slimrl.patching.every_trainer.state import config_state

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_op_against_fp64_on_cuda(dtype, tol):
    from slimrl.ops import chunked_logprobs
    from tests.ops.test_chunked_logprob import make, reference

    hidden, weight, _, targets = make(n=300, h=64, v=1031, dtype=dtype)
    h = hidden.detach().to(CUDA).requires_grad_()
    w = weight.detach().to(CUDA).requires_grad_()
    logps, ent = chunked_logprobs(h, w, targets.to(CUDA), temperature=0.8, chunk_rows=64, with_entropy=True)
    h64 = hidden.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    rl, re = reference(h64, w64, targets, temperature=0.8)

    def close(got: torch.Tensor, ref: torch.Tensor) -> None:
        got = got.detach().double().cpu()
        if dtype == torch.float32:
            torch.testing.assert_close(got, ref.detach(), rtol=tol, atol=tol)
        else:
            err = float((got - ref.detach()).norm() / ref.detach().norm())
            assert err <= tol, err

    close(logps, rl)
    close(ent, re)
    (logps.sum() + 0.5 * ent.sum()).backward()
    (rl.sum() + 0.5 * re.sum()).backward()
    close(h.grad, h64.grad)
    close(w.grad, w64.grad)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_grpo_patched_equals_trl_on_cuda(tmp_path, loss_type):
    from tests.patching.trainers.test_grpo import check_parity

    trainer = check_parity(tmp_path, loss_type, 0.04, use_cpu=False)
    assert next(trainer.model.parameters()).device.type == "cuda"


def _grpo(tmp_path, model, tok, **overrides):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    ds = Dataset.from_list([{"prompt": p} for p in ["1+2=", "3+4=", "5+6=", "7+8="]])

    def reward_digits(completions, **kwargs):
        return [float(sum(ch.isdigit() for ch in c)) for c in completions]

    cfg = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-3,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    cfg.update(overrides)
    return GRPOTrainer(
        model=model, args=GRPOConfig(**cfg), reward_funcs=[reward_digits], train_dataset=ds, processing_class=tok
    )


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")
def test_qlora_grpo_step(tmp_path, tiny_model_dir, grpo_patched):
    from slimrl import FastLanguageModel

    model, tok = FastLanguageModel.from_pretrained(str(tiny_model_dir), load_in_4bit=True)
    assert any(type(m).__name__ == "Linear4bit" for m in model.modules()), "the base is not 4-bit"
    model = FastLanguageModel.get_peft_model(model, r=4, init_lora_weights=False)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer = _grpo(tmp_path, model, tok)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters() if n in before)


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")
def test_4bit_gradients_after_generation_on_cuda(tiny_model_dir):
    from slimrl import FastLanguageModel

    def lora():
        model, _ = FastLanguageModel.from_pretrained(str(tiny_model_dir), load_in_4bit=True, dtype=torch.float32)
        return FastLanguageModel.get_peft_model(
            model, r=4, init_lora_weights=False, random_state=3, use_gradient_checkpointing=False
        )

    ids = torch.randint(3, 49, (2, 16), generator=torch.Generator().manual_seed(1)).to(CUDA)  # [B, T]

    def grads(model):
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}

    fresh, used = lora(), lora()
    assert any(type(m).__name__ == "Linear4bit" for m in used.modules()), "the base is not 4-bit"
    FastLanguageModel.for_inference(used)
    with torch.no_grad():
        used.generate(input_ids=ids[:, :6], max_new_tokens=6, do_sample=True)
    FastLanguageModel.for_training(used)
    a, b = grads(used), grads(fresh)
    assert max(float((a[n] - b[n]).norm() / b[n].norm()) for n in b) <= 1e-5


def test_fp16_scaler_skips_an_inf_step_and_the_guard_lets_it(tmp_path, grpo_patched):
    """fp32 weights, fp16 autocast with a GradScaler: the first backward gets an inf gradient (as a too-large loss
    scale gives); the scaler skips that step, training goes on, slimrl counts it in ``fp16/skipped_steps``."""
    from tests.tiny import tiny_llama, tiny_tokenizer

    model = tiny_llama(seed=0)
    calls = [0]

    def inf_once(grad):
        calls[0] += 1
        return grad * float("inf") if calls[0] == 1 else grad

    model.model.layers[0].mlp.down_proj.weight.register_hook(inf_once)
    trainer = _grpo(tmp_path, model, tiny_tokenizer(), fp16=True, bf16=False, gradient_checkpointing=False)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and calls[0] >= 2
    assert logs[-1]["fp16/skipped_steps"] >= 1


def test_precision_defaults_stay_trls_on_cuda(tmp_path):
    from trl import GRPOConfig

    from slimrl import PatchFastRL, unpatch

    ref = GRPOConfig(output_dir=str(tmp_path))
    PatchFastRL("grpo")
    try:
        cfg = GRPOConfig(output_dir=str(tmp_path))
    finally:
        unpatch()
    assert (cfg.bf16, cfg.fp16) == (ref.bf16, ref.fp16)
    assert not {"bf16", "fp16"} & set(config_state(cfg).changed)


def _checkpointed_grads(model, ids, offloaded: bool):
    from slimrl.models import checkpointing

    base = model.get_base_model()
    checkpointing.uninstall_policy(base)
    if offloaded:
        checkpointing.install_policy(base, offload=True)
    checkpointing.turn_on(base)
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    model(input_ids=ids, labels=ids).loss.backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - start
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, peak


def test_offloaded_checkpointing_exact_and_lighter_on_cuda():
    """8 layers, 4 x 2048 tokens, hidden 512: each layer input is 16 MiB in fp32. Offloaded, they live in pinned
    host memory: the peak drops by most of the 7 that GPU-resident checkpointing keeps while the last recomputes.
    Gradients: the copies are bit-exact, so only the kernels' own run-to-run order can differ (1e-6 relative)."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=1000,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=4096,
    )
    model = get_peft_model(
        LlamaForCausalLM(cfg).to(CUDA), LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    model.train()
    ids = torch.randint(0, 1000, (4, 2048), device=CUDA)
    ref, ref_peak = _checkpointed_grads(model, ids, offloaded=False)
    got, peak = _checkpointed_grads(model, ids, offloaded=True)
    assert model.get_base_model()._set_gradient_checkpointing.slimrl_offloader.packed >= 8
    for name, g in ref.items():
        torch.testing.assert_close(got[name], g, rtol=1e-6, atol=1e-8)
    layer_input = 4 * 2048 * 512 * 4
    assert peak < ref_peak - 3 * layer_input, (peak, ref_peak)
