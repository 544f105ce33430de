"""``slimrl export``: a trained adapter (a ``slimrl train`` output directory or any PEFT adapter directory) with its
base model, written as the adapter, the merged model and/or GGUF files (thin: parse, load, :mod:`slimrl.export`)."""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from slimrl.cli.oneline import fail, parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slimrl export", description=(
        "Write a trained LoRA adapter as the adapter, the merged model and/or GGUF files for llama.cpp / Ollama."))
    p.add_argument("--adapter", required=True, help="a slimrl train --output_dir (its adapter/) or an adapter "
                   "directory (adapter_config.json)")
    p.add_argument("--model", help="the base model (default: the one the adapter records)")
    p.add_argument("--output", help="where to write (default: <adapter's run>/export)")
    p.add_argument("--formats", default="merged_16bit,gguf:q8_0", help="comma-separated: lora, merged_16bit, "
                   "merged_4bit, gguf:<type> (gguf:q8_0, gguf:f16, gguf:q4_k_m, ...); default merged_16bit,gguf:q8_0")
    p.add_argument("--load_in_4bit", action="store_true", help="load the base in 4-bit (the merge dequantizes it)")
    return p


def adapter_directory(path: str) -> Path:
    """The adapter directory of a ``slimrl train`` output directory, or ``path`` itself; FileNotFoundError naming
    it otherwise."""
    p = Path(path).expanduser()
    for candidate in (p, p / "adapter"):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    raise FileNotFoundError(f"--adapter {path}: no adapter_config.json there nor in {p / 'adapter'}; pass a slimrl "
                            f"train --output_dir or an adapter directory")


def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    from slimrl.export.formats import export_all, parse_formats
    from slimrl.export.gguf import ExportError

    try:
        plain, types = parse_formats(args.formats)
        adapter = adapter_directory(args.adapter)
    except (ValueError, FileNotFoundError) as err:
        return fail("slimrl export", str(err))
    base = args.model or json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base:
        return fail("slimrl export", f"--adapter {adapter}: the adapter does not record its base model; pass --model")
    out = Path(args.output) if args.output else (adapter.parent / "export" if adapter.name == "adapter"
                                                  else adapter / "export")
    from peft import PeftModel

    from slimrl.models import FastLanguageModel
    from slimrl.models.methods import attach

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model, tokenizer = FastLanguageModel.from_pretrained(base, load_in_4bit=args.load_in_4bit)
        except (FileNotFoundError, ValueError) as err:
            return fail("slimrl export", f"--model {base}: {str(err).splitlines()[0]}")
        model = attach(PeftModel.from_pretrained(model, str(adapter)))
        model.slimrl_tokenizer = tokenizer
        print(f"slimrl export: {adapter} on {base} -> {out}", flush=True)
        try:
            export_all(model, tokenizer, out, plain, types)
        except ExportError as err:
            return fail("slimrl export", str(err))
    return 0
