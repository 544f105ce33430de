"""The export formats ``slimrl export`` and ``slimrl train --export`` take, one comma-separated list:
``lora``, ``merged_16bit``, ``merged_4bit``, ``gguf:<type>`` (``gguf:q8_0``, ``gguf:q4_k_m``, ... or Unsloth's
``gguf:quantized``), and :func:`export_all`, which writes them from a model into one output directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slimrl.export import api, gguf
from slimrl.export.files import check_target, size_text

PLAIN = ("lora", "merged_16bit", "merged_4bit")


def parse_formats(text: str, option: str = "--formats") -> tuple[list[str], list[str]]:
    """``(plain formats, GGUF types)`` of a comma-separated list; a ValueError naming ``option`` and the choices."""
    plain, types = [], []
    for item in (part.strip() for part in str(text).split(",")):
        if not item:
            continue
        if item.lower().startswith("gguf:"):
            try:
                types += gguf.normalise_methods(item.split(":", 1)[1])
            except gguf.ExportError as err:
                raise ValueError(f"{option} {item}: {err}") from None
        elif item in PLAIN:
            plain.append(item)
        else:
            raise ValueError(f"{option} {item!r}: use {', '.join(PLAIN)} or gguf:<type> (e.g. gguf:q8_0, gguf:q4_k_m)")
    if not plain and not types:
        raise ValueError(f"{option}: name at least one format ({', '.join(PLAIN)}, gguf:<type>)")
    return list(dict.fromkeys(plain)), list(dict.fromkeys(types))


def export_all(
    model: Any,
    tokenizer: Any,
    out: str | Path,
    plain: list[str],
    types: list[str],
    report=print,
    overwrite: bool = False,
) -> list[Path]:
    """Each format under ``out``: ``lora/``, ``merged_16bit/``, ``merged_4bit/``, ``gguf/`` (all GGUF types and the
    Modelfile); ``report(line)`` gets one line per thing written, with its size. Returns the paths."""
    out = Path(out)
    if types:  # checked first: a GGUF export that cannot run stops before any other file is written
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        gguf.check_can_export((getattr(base.config, "architectures", None) or [""])[0], types)
    for kind in [*plain, *(["gguf"] if types else [])]:  # every folder checked before the first is written
        check_target(out / kind, overwrite)
    written = []
    for kind in plain:
        path = (
            api.save_lora(model, out / kind, tokenizer, overwrite)
            if kind == "lora"
            else api.save_pretrained_merged(model, out / kind, tokenizer, save_method=kind, overwrite=overwrite)
        )
        report(f"  {kind:<14} {path}  {size_text(path)}")
        written.append(path)
    if types:
        for path in api.save_pretrained_gguf(
            model, out / "gguf", tokenizer, quantization_method=types, overwrite=overwrite
        ):
            report(f"  {'gguf':<14} {path}  {size_text(path)}")
            written.append(path)
        report(f"  {'ollama':<14} {out / 'gguf' / 'Modelfile'}  (ollama create NAME -f Modelfile)")
    return written
