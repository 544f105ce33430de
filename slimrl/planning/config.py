"""The model's ``config.json`` only, never its weights: a local directory, the built-in alias, or a hub id already in
the local Hugging Face cache (``slimrl plan`` downloads nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slimrl.errors import InputError


def load_config(model: str) -> Any:
    """``transformers`` config of ``model`` (see the module docstring); a config that cannot be read (broken JSON, no
    ``model_type``, an architecture this transformers does not know, a damaged GGUF) is a one-line
    :class:`InputError` naming ``--model``."""
    try:
        config = _load_config(model)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - transformers' and gguf's own errors, said in one line
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise InputError(
            f"--model {model}: its config cannot be read ({type(exc).__name__}: {first[:200]}); "
            f"pass a model directory with a valid config.json or an intact .gguf"
        ) from None
    text = getattr(config, "text_config", None) or config
    for field in ("num_hidden_layers", "hidden_size", "vocab_size"):
        value = getattr(text, field, None)
        if not isinstance(value, int) or value < 1:
            raise InputError(
                f"--model {model}: its config has no usable {field} ({value!r}); pass a complete config.json"
            )
    return config


def _load_config(model: str) -> Any:
    from transformers import AutoConfig

    from slimrl.models import loader

    if loader.is_builtin_alias(model):
        gguf = loader.smollm2_gguf_path()
        cached = loader._gguf_cache_dir(gguf) / "config.json"
        if cached.is_file():
            return AutoConfig.from_pretrained(cached.parent)
        return AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)  # metadata only
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(f"--model {model}: the directory has no config.json; pass a model directory")
        return AutoConfig.from_pretrained(path)
    if path.is_file() and path.suffix == ".gguf":
        return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    if loader._looks_like_a_path(model):
        raise InputError(
            f"--model {model}: no such file or directory; pass a model directory, a .gguf file, a "
            f"hub id in the local cache, or {loader.SMOLLM2_ALIAS}"
        )
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(model, "config.json")
    if not isinstance(found, str):
        raise InputError(
            f"--model {model}: config.json is not in the local Hugging Face cache (slimrl plan "
            f"downloads nothing); fetch it first (`hf download {model} config.json`) or pass a "
            f"local directory"
        )
    return AutoConfig.from_pretrained(Path(found).parent)
