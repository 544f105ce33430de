"""llama.cpp itself (through llama-cpp-python, ``make test-gguf``'s environment) reads the GGUF files slimrl exports
from SmolLM2-135M with a LoRA adapter of the size a few training steps give: the same tokens as the Hugging Face
tokenizer; greedy continuations of 5 prompts equal to the merged model's (f16: everywhere; q8_0, q4_k_m: up to the
first step whose greedy decision is a near-tie for the merged model, a top-2 logit margin under 0.5 (q8_0) or 1.0
(q4_k_m: :data:`CLEAR`), which 8-bit and 4-bit rounding may break either way, and llama.cpp also rounds activations
to 8 bits in its q8_0 / k-quant dot products); and top-1 agreement on every position, prompt and continuation, where
the merged model's decision is clear: 100 % for q8_0 and q4_k_m. llama.cpp is the portable x86-64 build
(``make envs``), whose dot products round in another order than a CPU-specific build's."""

from __future__ import annotations

import pytest
import torch

from slimrl.export import gguf

pytestmark = pytest.mark.skipif(
    not (gguf.converter_available() and gguf.quantizer_available()),
    reason="needs llama.cpp's converter and llama-cpp-python (make test-gguf)",
)

PROMPTS = [
    "The capital of France is",
    "def add(a, b):\n    return",
    "What is 12 + 7? The answer is",
    "Once upon a time, a small robot",
    "List three colours: red,",
]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from slimrl import FastLanguageModel
    from slimrl.export.merge import merged_model

    model, tok = FastLanguageModel.from_pretrained("SmolLM2-135M-Instruct", max_seq_length=256)
    model = FastLanguageModel.get_peft_model(
        model, r=8, lora_alpha=16, random_state=9, use_gradient_checkpointing=False
    )
    with torch.no_grad():  # an adapter the size a few training steps give (B starts at zero)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.01, generator=torch.Generator().manual_seed(len(name)))
    out = tmp_path_factory.mktemp("gguf")
    model.save_pretrained_gguf(out, tok, quantization_method=["f16", "q8_0", "q4_k_m"])
    return out, merged_model(model).eval(), tok


def _llama(path):
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_ctx=256, logits_all=True, verbose=False, seed=0, n_threads=2)


def _hf_greedy(model, tok, prompt: str) -> list[int]:
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )
    return out[0, ids.shape[1] :].tolist()


def _llama_greedy(llm, ids: list[int]) -> list[int]:
    out = []
    for token in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, reset=True):
        out.append(token)
        if len(out) == NEW_TOKENS or token == llm.token_eos():
            break
    return out


# a top-2 logit margin at or above which a greedy decision is not a near-tie for that type's rounding: 8-bit weights
# move a logit by well under 0.5; 4-bit k-quants by more (measured: a decision with a 0.66 margin flipped on the
# portable x86-64 build, whose k-quant dot products round in another order than the AVX-512 build's)
CLEAR = {"F16": 0.5, "Q8_0": 0.5, "Q4_K_M": 1.0}


def _margins(merged, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The merged model's greedy choice and its top-2 margin at every position of ``ids`` (``[T]`` each)."""
    with torch.no_grad():
        logits = merged(input_ids=torch.tensor([ids])).logits[0]  # [T, V]
    top2 = logits.topk(2, dim=-1).values  # [T, 2]
    return logits.argmax(-1), top2[:, 0] - top2[:, 1]


@pytest.mark.parametrize("kind", ["F16", "Q8_0", "Q4_K_M"])
def test_llama_cpp_reads_the_export_as_the_merged_model(exported, kind):
    out, merged, tok = exported
    llm = _llama(out / f"model.{kind}.gguf")
    agree = clear = compared = 0
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        assert llm.tokenize(prompt.encode(), add_bos=False, special=True) == ids, prompt
        ours, theirs = _llama_greedy(llm, ids), _hf_greedy(merged, tok, prompt)
        choice, margin = _margins(merged, ids + theirs)
        for step, (a, b) in enumerate(zip(ours, theirs, strict=False)):
            if kind != "F16" and margin[len(ids) + step - 1] < CLEAR[kind]:
                break  # a near-tie: rounding may break it either way; later tokens follow different contexts
            assert a == b, (kind, prompt, step)
            compared += 1
        llm.reset()
        llm.eval(ids + theirs)
        read = torch.tensor(llm.scores[: len(ids) + len(theirs)]).argmax(-1)  # [T]
        sure = margin >= CLEAR[kind]
        agree += int((read == choice)[sure].sum())
        clear += int(sure.sum())
    assert compared >= 10 and clear >= 40, (compared, clear)  # enough was compared for the test to mean something
    assert agree == clear, (kind, agree, clear)


def test_llama_cpp_is_built_for_any_x86_64_cpu():
    """``make envs`` builds llama.cpp without the build machine's instruction sets (tools/envs.py: PORTABLE_GGML):
    a library compiled with AVX-512 or AMX traps with an illegal instruction on a CPU without them, and on this
    project's VMs, whose CPU reports AMX that the hypervisor does not run. llama.cpp lists what it was compiled
    with (``NAME = 1``) in its system info."""
    import platform

    import llama_cpp

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the portable baseline is x86-64's")
    info = llama_cpp.llama_print_system_info().decode()
    compiled = {part.split("=")[0].strip() for part in info.split("|") if part.strip().endswith("= 1")}
    specific = {"AVX2", "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AMX_INT8", "AVX_VNNI", "FMA", "F16C"}
    assert not compiled & specific, f"llama.cpp was built for this CPU ({sorted(compiled & specific)}): {info}"
