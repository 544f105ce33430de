"""What slimrl's colocated vLLM engine holds on a CPU for the whole run (``fast_inference=True``, ``slimrl plan``).

On vLLM's CPU build the engine keeps, besides the base weights it shares with the training model (embeddings, norms;
:mod:`slimrl.generation.weights`):

* its own oneDNN-packed copy of every linear layer it runs, the decoder's projections and the LM head (computed:
  their weights in the compute dtype);
* its LoRA slots: ``max_lora_rank`` x (in + out) per adapted projection, and three vocabulary-wide ones for the
  embedding and the logits (computed);
* its runtime: vLLM's worker, the oneDNN handlers and what its start-up profile run leaves resident. That part is
  not in any formula: it is **measured** once per machine and model shape, in a subprocess that builds the model
  with two decoder layers (random weights from the config, nothing loaded), starts slimrl's engine on it, generates
  and puts it in standby, then subtracts the computed parts above (about 15 s; cached as JSON under
  ``SLIMRL_CACHE``). The runtime does not grow with depth (measured at 2, 4 and 30 layers of SmolLM2-135M's shape;
  docs/BENCHMARKS.md), so two layers stand for the model. It does depend on the machine: vLLM's CPU GEMM dispatch
  (oneDNN, sgl or zentorch, by ISA) decides what stays resident (518 MB on an AVX2 EPYC, 48 MB on the CI runner).

The KV cache is not here: vLLM's CPU build allocates it uninitialised, generation writes the pages it uses and
standby returns them after each generation, so the plan puts those pages in the ``generation`` phase.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from typing import Any

import torch

_CALIBRATION_LAYERS = 2


def computed_bytes(config: Any, lora_r: int, dtype: torch.dtype) -> int:
    """The packed linear copies and the LoRA slots (see the module docstring)."""
    from slimrl.compat.vllm_info import supported_lora_rank

    text = getattr(config, "text_config", None) or config
    size = torch.tensor([], dtype=dtype).element_size()
    hidden, vocab, layers = text.hidden_size, text.vocab_size, text.num_hidden_layers
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    inter = text.intermediate_size
    # (in, out) of each projection of one decoder layer: qkv, o, gate_up, down
    proj = [
        (hidden, (heads + 2 * kv_heads) * head_dim),
        (heads * head_dim, hidden),
        (hidden, 2 * inter),
        (inter, hidden),
    ]
    linear = layers * sum(i * o for i, o in proj) + vocab * hidden  # + the LM head
    rank = supported_lora_rank(max(lora_r, 1)) if lora_r else 0
    lora = rank * (layers * sum(i + o for i, o in proj) + 3 * vocab)
    return size * (linear + lora)


def _cache_file(config: Any, lora_r: int, dtype: torch.dtype):
    from slimrl.models.loader import cache_root

    text = getattr(config, "text_config", None) or config
    shape = json.dumps(
        [
            type(config).__name__,
            text.hidden_size,
            text.intermediate_size,
            text.vocab_size,
            text.num_attention_heads,
            getattr(text, "num_key_value_heads", None),
            lora_r,
            str(dtype),
            torch.get_num_threads(),
        ]
    )
    key = hashlib.sha256(shape.encode()).hexdigest()[:16]
    return cache_root() / f"engine-runtime-v1-cpu-{key}.json"


def runtime_bytes(config: Any, lora_r: int, dtype: torch.dtype) -> tuple[int | None, str]:
    """The engine's measured runtime on this machine for this shape (see the module docstring), cached; (None, why)
    where vLLM cannot start here."""
    from slimrl.compat.vllm_info import vllm_status

    path = _cache_file(config, lora_r, dtype)
    try:
        return int(json.loads(path.read_text())["runtime_bytes"]), "measured"
    except (OSError, ValueError, KeyError):
        pass
    why = vllm_status()
    if why is not None:
        return None, f"vLLM not usable here ({why})"
    small = config.to_dict()
    text = small.get("text_config") or small
    text["num_hidden_layers"] = _CALIBRATION_LAYERS
    if text.get("layer_types"):
        text["layer_types"] = text["layer_types"][:_CALIBRATION_LAYERS]
    code = _CALIBRATE.format(
        config=json.dumps(small),
        model_type=config.model_type,
        lora_r=max(lora_r, 8),
        dtype=str(dtype).removeprefix("torch."),
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", SLIMRL_AUTOPATCH="0"),
    )  # patching imports TRL (and vLLM) before the reading
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("SLIMRL_ENGINE_DELTA ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"engine calibration failed ({tail[:200]})"
    small_config = type(config).from_dict(small)
    delta = int(lines[-1].split()[1]) - computed_bytes(small_config, max(lora_r, 8), dtype)
    runtime = max(delta, 0)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"runtime_bytes": runtime}))
        tmp.replace(path)
    except OSError:
        pass
    return runtime, "measured"


# Run in a fresh process: the 2-layer model (random weights) saved with the built-in tokenizer, slimrl's engine
# started on it, one generation, standby; prints the resident bytes the engine added.
_CALIBRATE = """
import json, shutil, tempfile, warnings
warnings.simplefilter("ignore")
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from slimrl.models import FastLanguageModel  # not slimrl.FastLanguageModel: no patch on first use
from slimrl.compat.memory import resident_bytes
from slimrl.models.loader import resolve_model_path
from vllm import SamplingParams

d = tempfile.mkdtemp(prefix="slimrl-engine-calibration-")
try:
    fields = json.loads({config!r})
    fields.pop("model_type", None)
    config = AutoConfig.for_model({model_type!r}, **fields)
    tok = AutoTokenizer.from_pretrained(str(resolve_model_path("SmolLM2-135M-Instruct")))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.{dtype}).save_pretrained(d)
    tok.save_pretrained(d)
    model, _ = FastLanguageModel.from_pretrained(d, max_seq_length=256, dtype=torch.{dtype}, fast_inference=True,
                                                 max_lora_rank={lora_r})
    model = FastLanguageModel.get_peft_model(model, r={lora_r}, lora_alpha={lora_r}, use_gradient_checkpointing=False)
    engine = model.vllm_engine
    engine.max_num_seqs = 8
    before = resident_bytes()
    engine.load_adapter(model)
    engine.generate_ids([[1, 2, 3, 4]] * 8, SamplingParams(max_tokens=8, min_tokens=8))
    engine.standby()
    print("SLIMRL_ENGINE_DELTA", resident_bytes() - before)
finally:
    shutil.rmtree(d, ignore_errors=True)
"""
