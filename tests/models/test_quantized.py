"""Quantized bases (bitsandbytes) train with the same LoRA gradients whether or not the model generated first.

bitsandbytes repacks a ``Linear4bit`` for a CPU inference kernel without autograd when the layer runs in eval mode
on a CPU with AVX512-BF16 (:mod:`slimrl.models.quantized`). This machine may lack that instruction set, so the
fixture ``avx512bf16`` (tests/conftest.py) makes bitsandbytes believe it is there (``has_avx512bf16`` as its layers
read it at construction); :func:`test_the_simulation_reproduces_the_bug` shows that this reproduces the wrong
gradients on a model slimrl did not prepare, so the other tests cannot pass vacuously. Where the CPU has the
instruction set the fixture changes nothing and the real kernel runs.

Tolerance: 1e-5 relative (fp32 compute). The two models hold the same quantized weights and see the same batch, so
any difference is the bug, not rounding.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from slimrl import FastLanguageModel
from tests.tiny import CPU_ARGS, tiny_llama, tiny_tokenizer

bnb = pytest.importorskip("bitsandbytes", minversion="0.50")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU backend of bitsandbytes (tests/gpu: CUDA)")

TOL = 1e-5
AUTOGRAD_WARNING = "an autograd kernel was not registered"


@pytest.fixture
def quant_dir(tmp_path):
    """A tiny Llama wide enough for bitsandbytes' CPU repacking (output rows in blocks of 32)."""
    path = tmp_path / "tiny-q"
    tiny_llama(hidden_size=64, intermediate_size=128).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


BATCH = torch.randint(3, 49, (2, 16), generator=torch.Generator().manual_seed(1))  # [B, T]


def _lora(path, **load) -> torch.nn.Module:
    model, _ = FastLanguageModel.from_pretrained(str(path), max_seq_length=64, **load)
    return FastLanguageModel.get_peft_model(
        model, r=8, lora_alpha=8, use_gradient_checkpointing=False, init_lora_weights=False, random_state=3
    )


def _grads(model, missing_as_zero: bool = False) -> dict[str, torch.Tensor]:
    """Every trainable parameter's gradient of one loss; one that got none raises unless ``missing_as_zero``."""
    model.train()
    model.zero_grad()
    model(input_ids=BATCH, labels=BATCH).loss.backward()
    return {
        n: p.grad.detach().clone() if p.grad is not None or not missing_as_zero else torch.zeros_like(p)
        for n, p in model.named_parameters()
        if p.requires_grad
    }


def _generate(model) -> None:
    with torch.no_grad():
        model.generate(
            input_ids=BATCH[:, :6],
            attention_mask=torch.ones(2, 6, dtype=torch.long),
            max_new_tokens=6,
            do_sample=True,
            top_k=0,
        )


def _worst(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max(float((a[n] - b[n]).norm() / b[n].norm().clamp(min=1e-12)) for n in a)


def _linear4bit(model):
    return [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]


def test_the_simulation_reproduces_the_bug(quant_dir, avx512bf16):
    """Without slimrl's preparation, an eval-mode generation repacks the 4-bit layers and the next backward through
    them is wrong, with PyTorch's autograd warning (turned into an error by pyproject's filterwarnings). Where the
    CPU really has AVX512-BF16, bitsandbytes' packed kernel is its own C op and the layers below get no gradient at
    all (counted as zero: the most wrong); under the simulation on other CPUs they get a wrong one."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    def raw():
        m = AutoModelForCausalLM.from_pretrained(
            str(quant_dir),
            device_map="cpu",
            quantization_config=(
                BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
            ),
        )
        torch.manual_seed(3)
        return get_peft_model(
            m, LoraConfig(r=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
        )

    fresh, used = raw(), raw()
    used.eval()
    _generate(used)
    assert all(getattr(m.weight.quant_state, "packing_format_for_cpu", False) for m in _linear4bit(used))
    with pytest.raises(UserWarning, match=AUTOGRAD_WARNING):
        _grads(used)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=f".*{AUTOGRAD_WARNING}")
        assert _worst(_grads(used, missing_as_zero=True), _grads(fresh)) > 0.1


@pytest.mark.parametrize("bits", ["load_in_4bit", "load_in_8bit"])
def test_generate_then_train_gives_a_fresh_models_gradients(quant_dir, avx512bf16, bits):
    fresh, used = _lora(quant_dir, **{bits: True}), _lora(quant_dir, **{bits: True})
    layers = (
        _linear4bit(used)
        if bits == "load_in_4bit"
        else [m for m in used.modules() if isinstance(m, bnb.nn.Linear8bitLt)]
    )
    assert layers  # the base really is quantized
    FastLanguageModel.for_inference(used)
    _generate(used)
    FastLanguageModel.for_training(used)
    assert not any(
        getattr(m.weight, "quant_state", None) and m.weight.quant_state.__dict__.get("packing_format_for_cpu")
        for m in layers
    )
    assert _worst(_grads(used), _grads(fresh)) <= TOL


def test_8bit_layers_generate_with_the_training_numbers(quant_dir):
    """bitsandbytes' 8-bit eval mode on a CPU quantizes the activations; for_inference keeps the training path, so
    the generator's logits are the training model's."""
    model = _lora(quant_dir, load_in_8bit=True)
    model.train()
    with torch.no_grad():
        train_logits = model(input_ids=BATCH).logits  # [B, T, V]
        FastLanguageModel.for_inference(model)
        gen_logits = model(input_ids=BATCH).logits
        model.eval()  # bitsandbytes' own eval mode: int8 activations
        eval_logits = model(input_ids=BATCH).logits
    FastLanguageModel.for_training(model)
    assert torch.equal(gen_logits, train_logits)
    assert not torch.equal(eval_logits, train_logits)  # the test would notice if the flag stopped mattering


def test_both_quantizations_at_once_is_an_error(quant_dir):
    with pytest.raises(ValueError, match="load_in_4bit=True and load_in_8bit=True: pass one of them"):
        FastLanguageModel.from_pretrained(str(quant_dir), load_in_4bit=True, load_in_8bit=True)


def test_unpack_restores_the_training_layout_exactly():
    """slimrl's inverse of bitsandbytes' CPU repacking gives back the stored bytes, and the weight dequantizes to
    the original with the block scales rounded to bf16 (the rounding the repacking applied), double quantization
    on or off."""
    import bitsandbytes.functional as bf

    from slimrl.models.quantized import unpack_cpu_weight

    for nested in (False, True):
        w = torch.randn(96, 128, generator=torch.Generator().manual_seed(0))  # [N, K]
        q, state = bf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=nested)
        scales = bf.dequantize_blockwise(state.absmax, state.state2) + state.offset if nested else state.absmax
        expected_state = copy.deepcopy(state)
        expected_state.absmax, expected_state.nested = scales.bfloat16().float(), False
        packed, packed_state = bf._convert_weight_packed_for_cpu(q.clone(), copy.deepcopy(state))
        unpacked = unpack_cpu_weight(packed, packed_state)
        assert torch.equal(unpacked, q)
        assert not packed_state.packing_format_for_cpu and not packed_state.nested
        assert torch.equal(bf.dequantize_4bit(unpacked, packed_state), bf.dequantize_4bit(q, expected_state))


def test_a_model_repacked_before_slimrl_saw_it_is_unpacked_with_a_warning(quant_dir, avx512bf16):
    """A 4-bit model run in eval mode before ``get_peft_model`` / a patched trainer: its layers are unpacked (one
    warning) and train with the gradients of the same model whose scales were rounded to bf16 directly."""
    import bitsandbytes.functional as bf
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    def raw():
        return AutoModelForCausalLM.from_pretrained(
            str(quant_dir),
            device_map="cpu",
            quantization_config=(
                BitsAndBytesConfig(
                    load_in_4bit=True,
                    bnb_4bit_quant_type="nf4",
                    bnb_4bit_compute_dtype=torch.float32,
                    bnb_4bit_use_double_quant=True,
                )
            ),
        )

    used, ref = raw(), raw()
    used.eval()
    _generate(used)
    for layer in _linear4bit(ref):  # the same scales, rounded to bf16 without any repacking
        state = layer.weight.quant_state
        state.absmax = (bf.dequantize_blockwise(state.absmax, state.state2) + state.offset).bfloat16().float()
        state.nested = False
    with pytest.warns(UserWarning, match=r"14 4-bit layers .* had been repacked by bitsandbytes"):
        used = FastLanguageModel.get_peft_model(
            used, r=8, init_lora_weights=False, random_state=3, use_gradient_checkpointing=False
        )
    ref = FastLanguageModel.get_peft_model(
        ref, r=8, init_lora_weights=False, random_state=3, use_gradient_checkpointing=False
    )
    assert _worst(_grads(used), _grads(ref)) <= TOL


def test_grpo_step_after_a_real_generation_matches_a_fresh_model(quant_dir, avx512bf16, grpo_patched):
    """The patched GRPO trainer generates (for_inference -> HF generate -> for_training) and scores a batch; its
    loss and LoRA gradients on that batch equal those of a fresh model that never generated."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    def trainer(model, out):
        args = GRPOConfig(
            output_dir=str(out),
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=6,
            beta=0.04,
            temperature=0.9,
            max_steps=1,
            logging_steps=1,
            gradient_checkpointing=False,
            **CPU_ARGS,
        )
        return GRPOTrainer(
            model=model,
            args=args,
            processing_class=tiny_tokenizer(),
            reward_funcs=[lambda completions, **kw: [float(len(c)) for c in completions]],
            train_dataset=Dataset.from_list([{"prompt": p} for p in ["1+2=", "3+4=", "5+6=", "7+8="]]),
        )

    used = trainer(_lora(quant_dir, load_in_4bit=True), quant_dir.parent / "a")
    fresh = trainer(_lora(quant_dir, load_in_4bit=True), quant_dir.parent / "b")
    torch.manual_seed(0)
    batch = used._generate_and_score_completions(next(iter(used.get_train_dataloader())))  # a real generation

    def loss_and_grads(t):
        t.model.train()
        t.model.zero_grad()
        t.current_gradient_accumulation_steps = 1  # set by Trainer.train's loop; the step runs here by hand
        loss = t.compute_loss(t.model, dict(batch))
        loss.backward()
        return float(loss), {n: p.grad.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}

    (loss_a, grads_a), (loss_b, grads_b) = loss_and_grads(used), loss_and_grads(fresh)
    assert abs(loss_a - loss_b) <= TOL * max(abs(loss_b), 1e-3)
    assert _worst(grads_a, grads_b) <= TOL
