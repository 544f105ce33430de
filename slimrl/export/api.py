"""Unsloth's export calls, as functions of the model (``slimrl.models.methods`` binds them to every model
``FastLanguageModel`` returns): the adapter alone, the merged model (16-bit, or 4-bit on request), GGUF files, and the
same pushed to the Hugging Face Hub. Every writer stages its files and moves them in only when complete
(:func:`slimrl.export.files.staged_directory`), removes only the files of its own previous export there, and refuses
(before any compute) to replace a file it does not own unless ``overwrite=True``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slimrl.compat.model_state import model_state
from slimrl.compat.runtime.callsite import warn
from slimrl.export import gguf, merge
from slimrl.export.files import check_target, staged_directory, temp_directory

SAVE_METHODS = ("merged_16bit", "merged_4bit", "lora")


def _tokenizer(model: Any, tokenizer: Any) -> Any:
    if tokenizer is not None:
        return tokenizer
    return model_state(model).tokenizer


# SentencePiece model files: transformers 5 tokenizers save tokenizer.json only, while llama.cpp's converter reads
# the SentencePiece model for some families (Gemma 2 only through it)
SENTENCEPIECE_FILES = ("tokenizer.model",)


def _save_tokenizer(model: Any, tok: Any, directory: Path) -> None:
    """``tok.save_pretrained(directory)``, plus the SentencePiece model files of the directory the model or the
    tokenizer was loaded from that the save did not write (:data:`SENTENCEPIECE_FILES`)."""
    import shutil

    tok.save_pretrained(str(directory))
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    sources = [
        model_state(model).model_path,
        getattr(tok, "name_or_path", None),
        getattr(getattr(base, "config", None), "_name_or_path", None),
    ]
    for name in SENTENCEPIECE_FILES:
        if (Path(directory) / name).exists():
            continue
        found = next((Path(s) / name for s in sources if s and (Path(s) / name).is_file()), None)
        if found is not None:
            shutil.copyfile(found, Path(directory) / name)


def _folder(save_directory: Any, call: str) -> Path:
    """``save_directory`` as a Path, or a TypeError naming the call and the fix (before anything is computed)."""
    if not isinstance(save_directory, str | Path) or not str(save_directory).strip():
        raise TypeError(f"{call}(save_directory={save_directory!r}): pass the folder to write to, a str or a Path")
    return Path(save_directory)


def _dtype(dtype: Any) -> Any:
    """``dtype=`` as a torch floating dtype (a name such as 'bfloat16' or a torch.dtype), or a ValueError."""
    import torch

    value = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if (value is None and dtype is not None) or (
        value is not None and not (isinstance(value, torch.dtype) and value.is_floating_point)
    ):
        raise ValueError(f"dtype={dtype!r}: pass a floating torch dtype, e.g. 'bfloat16', 'float16' or 'float32'")
    return value


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def save_lora(model: Any, save_directory: str | Path, tokenizer: Any = None, overwrite: bool = False) -> Path:
    """The LoRA adapter (PEFT's ``adapter_model.safetensors`` + ``adapter_config.json``) and the tokenizer."""
    save_directory = _folder(save_directory, "save_lora")
    if not _is_peft(model):
        raise ValueError(
            "save_lora: the model has no LoRA adapter (add one with FastLanguageModel.get_peft_model); "
            "save the whole model with save_pretrained_merged"
        )
    with staged_directory(save_directory, overwrite, kind="lora") as stage:
        model.save_pretrained(str(stage))
        tok = _tokenizer(model, tokenizer)
        if tok is not None:
            _save_tokenizer(model, tok, stage)
    return Path(save_directory)


def save_pretrained_merged(
    model: Any,
    save_directory: str | Path,
    tokenizer: Any = None,
    save_method: str = "merged_16bit",
    dtype: Any = None,
    overwrite: bool = False,
    **kwargs: Any,
) -> Path:
    """The model with its adapter merged (:mod:`slimrl.export.merge`) as a plain transformers model directory
    (safetensors, config without quantization, generation config, tokenizer). ``save_method``: ``"merged_16bit"``
    (the model's own floating dtype: 16-bit for 16-bit and 4-bit bases, an fp32 base stays fp32; ``dtype=``
    overrides), ``"merged_4bit"`` (the merged weights quantized to NF4 again: costs the 4-bit rounding on every
    weight, said in a warning), ``"lora"`` (the adapter only, :func:`save_lora`). Other keywords go to
    ``save_pretrained`` (``max_shard_size``, ...)."""
    save_directory = _folder(save_directory, "save_pretrained_merged")
    if save_method not in SAVE_METHODS:
        raise ValueError(f"save_method={save_method!r}: use one of {', '.join(SAVE_METHODS)}")
    dtype = _dtype(dtype)
    if save_method == "lora":
        return save_lora(model, save_directory, tokenizer, overwrite)
    check_target(save_directory, overwrite, kind=save_method)  # before the merge: a refusal costs no compute
    for unsloth_only in ("temporary_location", "maximum_memory_usage", "push_to_hub", "token", "private"):
        kwargs.pop(unsloth_only, None)  # Unsloth's memory knobs; the merge here holds one model copy
    merged = merge.merged_model(model, dtype)
    with staged_directory(save_directory, overwrite, kind=save_method) as stage:
        if save_method == "merged_4bit":
            _save_4bit(merged, stage, **kwargs)
        else:
            merged.save_pretrained(str(stage), safe_serialization=True, **kwargs)
        tok = _tokenizer(model, tokenizer)
        if tok is not None:
            _save_tokenizer(model, tok, stage)
    return Path(save_directory)


def _save_4bit(merged: Any, stage: Path, **kwargs: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    warn(
        "save_method='merged_4bit' quantizes the merged weights to NF4 again: every weight gets 4-bit "
        "rounding (the merged model no longer equals the trained one exactly); merged_16bit keeps them",
        UserWarning,
    )
    with temp_directory("merged") as tmp:
        merged.save_pretrained(tmp, safe_serialization=True)
        dtype = merged.dtype if merged.dtype != torch.float32 else torch.bfloat16
        config = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype, bnb_4bit_use_double_quant=True
        )
        device = "cuda" if torch.cuda.is_available() else "cpu"
        quantized = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=config, device_map=device)
        quantized.save_pretrained(str(stage), safe_serialization=True, **kwargs)


def save_pretrained_gguf(
    model: Any,
    save_directory: str | Path,
    tokenizer: Any = None,
    quantization_method: str | list[str] = "fast_quantized",
    overwrite: bool = False,
    **kwargs: Any,
) -> list[Path]:
    """One GGUF per ``quantization_method`` (Unsloth's default ``"fast_quantized"`` = q8_0; ``"quantized"`` =
    q4_k_m; any llama.cpp type name, or a list) of the merged model, plus an Ollama ``Modelfile``, in
    ``save_directory`` (:mod:`slimrl.export.gguf`). Checked before anything is written: the types, the converter,
    the quantizer where a type needs it, the architecture. Returns the GGUF paths."""
    save_directory = _folder(save_directory, "save_pretrained_gguf")
    methods = gguf.normalise_methods(quantization_method)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    architecture = (getattr(base.config, "architectures", None) or [type(base).__name__])[0]
    gguf.check_can_export(architecture, methods)
    tok = _tokenizer(model, tokenizer)
    if tok is None:
        raise ValueError("save_pretrained_gguf needs the tokenizer (GGUF files carry it): pass tokenizer=")
    check_target(save_directory, overwrite, kind="gguf")
    with temp_directory("merged") as tmp:
        merged = merge.merged_model(model)
        merged.save_pretrained(tmp, safe_serialization=True)
        _save_tokenizer(model, tok, Path(tmp))
        del merged
        source = "bf16" if str(merge.output_dtype(model)) == "torch.bfloat16" else "f16"
        with staged_directory(save_directory, overwrite, kind="gguf") as stage:
            files = gguf.write_gguf(Path(tmp), stage, methods, source_dtype=source)
            (stage / "Modelfile").write_text(gguf.modelfile(files[0].name, gguf.eos_texts(tok)))
            names = [f.name for f in files]
    return [Path(save_directory) / name for name in names]


def push_to_hub_merged(
    model: Any,
    repo_id: str,
    tokenizer: Any = None,
    save_method: str = "merged_16bit",
    token: str | None = None,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str = "Upload model trained with slimrl",
    **kwargs: Any,
) -> str:
    """:func:`save_pretrained_merged` into a temporary directory, uploaded to ``repo_id`` on the Hub (created if
    missing; ``HF_ENDPOINT`` honoured). Returns the commit URL."""
    from slimrl.export import hub

    with temp_directory("push") as tmp:
        save_pretrained_merged(model, tmp, tokenizer, save_method=save_method, **kwargs)
        return hub.upload_folder(
            tmp, repo_id, token=token, private=private, revision=revision, commit_message=commit_message
        )


def push_to_hub_gguf(
    model: Any,
    repo_id: str,
    tokenizer: Any = None,
    quantization_method: str | list[str] = "fast_quantized",
    token: str | None = None,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str = "Upload GGUF trained with slimrl",
    **kwargs: Any,
) -> str:
    """:func:`save_pretrained_gguf` into a temporary directory, uploaded to ``repo_id`` on the Hub. Returns the
    commit URL."""
    from slimrl.export import hub

    with temp_directory("push") as tmp:
        save_pretrained_gguf(model, tmp, tokenizer, quantization_method=quantization_method)
        return hub.upload_folder(
            tmp, repo_id, token=token, private=private, revision=revision, commit_message=commit_message
        )
