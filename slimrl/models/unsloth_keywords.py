"""Unsloth's ``from_pretrained`` / ``get_peft_model`` keywords: what slimrl does with each, declared once.

Unsloth notebooks pass keywords that transformers and PEFT do not know (``offload_embedding=True``,
``unsloth_vllm_standby=True``, ...). Passed on, they stop the script with a ``TypeError`` deep inside transformers.
Each keyword is declared here with what slimrl does with it, one of:

* ``honoured`` — slimrl does what Unsloth documents for it (the ``does`` text says how);
* ``passed`` — it is a transformers / PEFT argument of the same name and meaning, passed on as it is;
* ``ignored`` — it cannot mean anything for slimrl on this machine (or is Unsloth's own machinery): accepted, and
  when it is given a value other than its "off" value one line says it was ignored and why (once per keyword).

:func:`take` pops the ``ignored`` ones (printing their lines) and leaves the rest for the caller;
:func:`keyword_table` is docs/compatibility.md's table (a test keeps the two equal).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Keyword:
    name: str
    where: str  # "from_pretrained" | "get_peft_model"
    action: str  # "honoured" | "passed" | "ignored"
    does: str  # what slimrl does with it (README text; for "ignored", the reason printed)
    off: tuple = (None, False)  # values that ask for nothing: accepted without a line


F, P = "from_pretrained", "get_peft_model"
KEYWORDS: tuple[Keyword, ...] = (
    Keyword("model_name", F, "honoured", "local directory, GGUF file, hub id from the cache or downloaded"),
    Keyword("max_seq_length", F, "honoured", "stored as `model.max_seq_length`; bounds prompt + completion"),
    Keyword("dtype", F, "honoured", "weights' dtype (None: bf16 on a bf16 GPU, fp16 on older GPUs, fp32 on CPU)"),
    Keyword(
        "load_in_4bit",
        F,
        "honoured",
        "NF4 through bitsandbytes (CUDA; CPU with bitsandbytes >= 0.50), else one line and the model in `dtype`",
    ),
    Keyword("load_in_8bit", F, "honoured", "LLM.int8() through bitsandbytes, same conditions as 4-bit"),
    Keyword("load_in_16bit", F, "honoured", "no quantization (weights in `dtype`)"),
    Keyword(
        "full_finetuning",
        F,
        "honoured",
        "every weight trains: not quantized, and `get_peft_model` then adds no adapter (one line)",
    ),
    Keyword(
        "fast_inference",
        F,
        "honoured",
        "colocated vLLM engine as `model.vllm_engine` on the training model's "
        "weights, 4-bit included (HF generate without vLLM, one line)",
    ),
    Keyword(
        "gpu_memory_utilization",
        F,
        "honoured",
        "the engine's share of the GPU, its (shared) weights included, as "
        "in Unsloth; or `'auto'`; checked with vLLM's own start-up check before any weight loads",
    ),
    Keyword("max_lora_rank", F, "honoured", "largest LoRA rank the engine serves"),
    Keyword("random_state", F, "honoured", "the engine's sampling seed"),
    Keyword("use_exact_model_name", F, "honoured", "slimrl always loads the exact name it is given"),
    Keyword("unsloth_vllm_standby", F, "honoured", "slimrl's engine always releases its KV cache while training"),
    Keyword("disable_log_stats", F, "honoured", "the engine logs no vLLM statistics"),
    Keyword(
        "float8_kv_cache",
        F,
        "honoured",
        "fp8 KV cache in the engine on GPUs with fp8 (compute capability "
        ">= 8.9: L4, RTX 4090, H100; `kv_cache_dtype='fp8'`); ignored with one "
        "line elsewhere (older GPUs, a CPU)",
    ),
    Keyword("use_gradient_checkpointing", F, "honoured", "the default of `get_peft_model`'s keyword of that name"),
    Keyword("resize_model_vocab", F, "honoured", "`model.resize_token_embeddings(n)` after loading"),
    Keyword("token", F, "passed", "hub token for a download"),
    Keyword("revision", F, "passed", "hub revision"),
    Keyword("trust_remote_code", F, "passed", "transformers' (default False)"),
    Keyword(
        "device_map",
        F,
        "passed",
        "transformers'; without it, on CUDA the model loads on the process's GPU "
        "(`LOCAL_RANK` under torchrun), shard by shard, as Unsloth's does",
    ),
    Keyword("rope_scaling", F, "passed", "transformers' config override"),
    Keyword(
        "offload_embedding",
        F,
        "ignored",
        "the input embedding stays with the model (on a CPU it is in host memory already)",
    ),
    Keyword(
        "fix_tokenizer",
        F,
        "ignored",
        "slimrl uses the tokenizer as saved (pad token set to EOS if missing)",
        off=(None, False, True),
    ),
    Keyword("float32_mixed_precision", F, "ignored", "precision follows `dtype` and the trainer's bf16/fp16"),
    Keyword(
        "load_in_fp8",
        F,
        "honoured",
        "the engine's weights in FP8 (vLLM's `quantization='fp8'`, TRL's "
        "importance-sampling correction on): W8A8 from compute capability 8.9, "
        "weight-only FP8 from 7.5 (one line), 16-bit below and on CPU (one "
        "line); the trainer's weights stay in `dtype`",
    ),
    Keyword("qat_scheme", F, "ignored", "no quantization-aware training in slimrl"),
    Keyword(
        "unsloth_tiled_mlp",
        F,
        "honoured",
        "each decoder MLP runs a tile of tokens at a time, checkpointed "
        "per tile (True: tiles of hidden_size tokens; an int: that many; not "
        "given: slimrl's default, tiles on CUDA where the plan says they pay)",
    ),
    Keyword("r", P, "honoured", "LoRA rank (at most `max_lora_rank`)"),
    Keyword("target_modules", P, "honoured", "None: every attention and MLP projection"),
    Keyword("lora_alpha", P, "passed", "PEFT's"),
    Keyword("lora_dropout", P, "passed", "PEFT's"),
    Keyword("bias", P, "passed", "PEFT's"),
    Keyword(
        "use_gradient_checkpointing",
        P,
        "honoured",
        "`'unsloth'` / `'slimrl'`: checkpointing with layer inputs "
        "offloaded to host memory on CUDA; True, False, "
        "`'selective'`",
    ),
    Keyword("random_state", P, "honoured", "seeds the adapter initialisation"),
    Keyword("max_seq_length", P, "honoured", "stored as `model.max_seq_length`"),
    Keyword("use_rslora", P, "passed", "PEFT's rank-stabilised scaling"),
    Keyword("loftq_config", P, "passed", "PEFT's (None or {}: no LoftQ)"),
    Keyword("init_lora_weights", P, "passed", "PEFT's"),
    Keyword("layers_to_transform", P, "passed", "PEFT's"),
    Keyword("layers_pattern", P, "passed", "PEFT's"),
    Keyword("modules_to_save", P, "passed", "PEFT's"),
    Keyword(
        "finetune_language_layers",
        P,
        "honoured",
        "False: no adapter on the language model (text models: nothing to train, an error)",
    ),
    Keyword("finetune_attention_modules", P, "honoured", "False: no adapter on attention projections"),
    Keyword("finetune_mlp_modules", P, "honoured", "False: no adapter on MLP projections"),
    Keyword(
        "finetune_vision_layers",
        P,
        "honoured",
        "vision-language models (`FastModel` / `FastVisionModel`): "
        "False leaves the vision tower without adapters; a text "
        "model has none",
    ),
    Keyword(
        "temporary_location",
        P,
        "ignored",
        "Unsloth's scratch directory; slimrl's writes go through temporary directories of their own",
        off=(None, "_unsloth_temporary_saved_buffers"),
    ),
    Keyword("qat_scheme", P, "ignored", "no quantization-aware training in slimrl"),
    Keyword("ensure_weight_tying", P, "ignored", "slimrl adds no adapter to tied embeddings"),
)

_SAID: set[tuple[str, str]] = set()


def declared(where: str, action: str | None = None) -> dict[str, Keyword]:
    return {k.name: k for k in KEYWORDS if k.where == where and (action is None or k.action == action)}


def take(where: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` without the ``ignored`` keywords of ``where``; a line on stderr for each given a value other
    than its "off" value (once per keyword and process)."""
    out = dict(kwargs)
    for name, keyword in declared(where, "ignored").items():
        if name not in out:
            continue
        value = out.pop(name)
        if any(value is off or (not isinstance(value, bool) and value == off) for off in keyword.off):
            continue
        if (where, name) not in _SAID:
            _SAID.add((where, name))
            note(f"{where}({name}={value!r}) ignored: {keyword.does}")
    return out


def note(line: str) -> None:
    """One ``slimrl:`` line on stderr."""
    print(f"slimrl: {line}", file=sys.stderr, flush=True)


def keyword_table() -> str:
    """docs/compatibility.md's table of Unsloth keywords (markdown)."""
    rows = ["| keyword | in | slimrl | what it does here |", "|---|---|---|---|"]
    rows += [f"| `{k.name}` | `{k.where}` | {k.action} | {k.does} |" for k in KEYWORDS]
    return "\n".join(rows)
