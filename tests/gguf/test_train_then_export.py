"""Issue 29's "done when": an Unsloth-notebook-shaped script (``examples/train_then_export.py``: GRPO steps through
slimrl, ``save_lora``, ``fast_generate`` with ``load_lora``, ``save_pretrained_merged`` and
``save_pretrained_gguf(..., "q4_k_m")``) runs to the end on this CPU, run from where it is as a user runs it; its
q4_k_m GGUF is read by llama.cpp, whose greedy reply to the arithmetic question is the merged model's first token
on (the first step only: 4-bit rounding may flip later near-ties, see test_llama_cpp.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slimrl.export import gguf

pytestmark = pytest.mark.skipif(
    not (gguf.converter_available() and gguf.quantizer_available()),
    reason="needs llama.cpp's converter and llama-cpp-python (make test-gguf)",
)

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_then_export.py"


def test_the_notebook_ending_runs_and_llama_cpp_reads_its_gguf(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "with the trained adapter: '" in proc.stdout
    for name in (
        "grpo_saved_lora/adapter_model.safetensors",
        "model/model.safetensors",
        "gguf/model.Q4_K_M.gguf",
        "gguf/Modelfile",
    ):
        assert (tmp_path / name).is_file() and (tmp_path / name).stat().st_size > 0, name
        assert f"{name}  " in proc.stdout  # the script says what it wrote, with its size

    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "model")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32).eval()
    prompt = "What is 12 + 7? The answer is"
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        top = merged(ids).logits[0, -1].topk(2)
    assert float(top.values[0] - top.values[1]) >= 0.5, "a near-tie: the check would not be meaningful"
    llm = Llama(
        model_path=str(tmp_path / "gguf/model.Q4_K_M.gguf"),
        n_ctx=128,
        logits_all=True,
        verbose=False,
        seed=0,
        n_threads=2,
    )
    first = llm.tokenize(prompt.encode(), add_bos=False)
    assert first == ids[0].tolist()  # the GGUF carries the tokenizer
    llm.eval(first)
    assert int(llm.scores[len(first) - 1].argmax()) == int(top.indices[0])
