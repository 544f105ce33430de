"""``slimrl export``: a trained adapter (a ``slimrl train`` output directory or any PEFT adapter directory) with its
base model, written as the adapter, the merged model and/or GGUF files (thin: parse, load, :mod:`slimrl.export`)."""

from __future__ import annotations

import argparse
import json
import re
import warnings
from pathlib import Path

from slimrl.cli.oneline import fail, parse
from slimrl.compat.model_state import attach_state, model_state


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slimrl export",
        description=(
            "Write a trained LoRA adapter as the adapter, the merged model and/or GGUF files for llama.cpp / Ollama."
        ),
    )
    p.add_argument(
        "--adapter",
        required=True,
        help="a slimrl train --output_dir (its adapter/) or an adapter directory (adapter_config.json)",
    )
    p.add_argument("--model", help="the base model (default: the one the adapter records)")
    p.add_argument(
        "--output",
        help="where to write (default: <adapter's run>/export; a checkpoint's: "
        "<run>/exports/checkpoint-N, out of the checkpoints' rotation; <adapter>-export beside a plain "
        "adapter folder); never inside the adapter",
    )
    p.add_argument(
        "--formats",
        default="merged_16bit,gguf:q8_0",
        help="comma-separated: lora, merged_16bit, "
        "merged_4bit, gguf:<type> (gguf:q8_0, gguf:f16, gguf:q4_k_m, ...); default merged_16bit,gguf:q8_0",
    )
    p.add_argument("--load_in_4bit", action="store_true", help="load the base in 4-bit (the merge dequantizes it)")
    p.add_argument(
        "--push_to_hub",
        metavar="REPO",
        help="then upload what was written to this Hub model repo "
        "(user/name; created if missing; HF_TOKEN and HF_ENDPOINT honoured)",
    )
    p.add_argument("--private", action="store_true", help="with --push_to_hub: a new repo is private")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace files in --output that no slimrl export wrote (default: refuse, naming them)",
    )
    return p


def adapter_directory(path: str) -> Path:
    """The adapter directory of a ``slimrl train`` output directory, or ``path`` itself; FileNotFoundError naming
    it otherwise."""
    p = Path(path).expanduser()
    for candidate in (p, p / "adapter"):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    raise FileNotFoundError(
        f"--adapter {path}: no adapter_config.json there nor in {p / 'adapter'}; pass a slimrl "
        f"train --output_dir or an adapter directory"
    )


def _config(adapter: Path) -> dict:
    """The adapter's config, or ValueError naming what is wrong with it."""
    try:
        config = json.loads((adapter / "adapter_config.json").read_text())
    except ValueError as err:
        raise ValueError(
            f"--adapter {adapter}: adapter_config.json is not valid JSON ({err}); re-save the adapter"
        ) from None
    if not isinstance(config, dict):
        raise ValueError(f"--adapter {adapter}: adapter_config.json holds no settings; re-save the adapter")
    weights = [adapter / n for n in ("adapter_model.safetensors", "adapter_model.bin") if (adapter / n).is_file()]
    if not weights:
        raise ValueError(f"--adapter {adapter}: no adapter_model.safetensors beside its config; re-save the adapter")
    return config


CHECKPOINT = re.compile(r"^checkpoint-\d+$")


def output_folder(args: argparse.Namespace, adapter: Path) -> Path:
    """``--output``, or the default beside the adapter; never the adapter's own folder nor inside it."""
    if args.output is not None and not args.output.strip():
        raise ValueError("--output '': an empty path (it would write into the current folder); pass a folder")
    if args.output:
        out = Path(args.output).expanduser()
    else:
        out = (
            adapter.parent / "export"
            if adapter.name == "adapter"
            # a checkpoint's export: "checkpoint-N-export" beside it would be taken for a checkpoint and deleted
            # by the rotation of a resumed run (transformers globs checkpoint-*)
            else adapter.parent / "exports" / adapter.name
            if CHECKPOINT.match(adapter.name)
            else adapter.parent / f"{adapter.name}-export"
        )
    resolved, source = out.resolve(), adapter.resolve()
    if resolved == source or source in resolved.parents:
        raise ValueError(
            f"--output {out}: inside the adapter folder {adapter}, which the export would change; "
            f"choose a folder outside it"
        )
    if out.exists() and not out.is_dir():
        raise ValueError(f"--output {out}: is a file; choose a folder")
    return out


def clear_of_adapter(folder: Path, adapter: Path) -> None:
    """A format's folder (``--output``/lora, ...) is neither the adapter's folder nor inside it nor above it, links
    resolved: the export would rewrite the adapter it reads (ValueError, one line)."""
    resolved, source = folder.resolve(), adapter.resolve()
    if resolved == source or source in resolved.parents or resolved in source.parents:
        raise ValueError(
            f"--output: {folder} is the adapter folder {adapter} or holds it (links resolved), which "
            f"the export would rewrite; choose an --output outside it"
        )


def _load(base: str, adapter: Path, load_in_4bit: bool):
    from peft import PeftModel

    from slimrl.models import FastLanguageModel
    from slimrl.models.methods import attach

    try:
        model, tokenizer = FastLanguageModel.from_pretrained(base, load_in_4bit=load_in_4bit)
    except (FileNotFoundError, ValueError, OSError) as err:
        raise ValueError(f"--model {base}: {str(err).splitlines()[0]}") from None
    try:
        model = attach(PeftModel.from_pretrained(model, str(adapter)))
    except RuntimeError as err:  # size mismatches: the adapter was trained on another base
        lines = [ln.strip() for ln in str(err).splitlines() if "size mismatch" in ln] or [str(err).splitlines()[0]]
        raise ValueError(
            f"--adapter {adapter}: its weights do not fit {base} ({lines[0][:240]}); pass the --model it was trained on"
        ) from None
    except Exception as err:  # noqa: BLE001 - a truncated or damaged weights file (safetensors' own error type too)
        raise ValueError(
            f"--adapter {adapter}: its weights cannot be read ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:160]}); re-save the adapter"
        ) from None
    state = model_state(model)
    state.tokenizer = tokenizer  # the export's tokenizer
    attach_state(model, state)
    return model, tokenizer


def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    from slimrl.export.files import ExportConflictError, check_target
    from slimrl.export.formats import export_all, parse_formats
    from slimrl.export.gguf import ExportError

    try:
        plain, types = parse_formats(args.formats)
        if args.push_to_hub is not None:  # checked before the export, not after minutes of it
            from slimrl.export.hub import HubError, check_repo_id

            try:
                check_repo_id(args.push_to_hub)
            except HubError as err:
                raise ValueError(f"--push_to_hub {args.push_to_hub}: {err}") from None
        adapter = adapter_directory(args.adapter)
        config = _config(adapter)
        out = output_folder(args, adapter)
        for kind in [*plain, *(["gguf"] if types else [])]:
            clear_of_adapter(out / kind, adapter)
            check_target(out / kind, args.overwrite, kind=kind)
    except (ValueError, FileNotFoundError, ExportConflictError) as err:
        return fail("slimrl export", str(err))
    base = args.model or config.get("base_model_name_or_path")
    if not base:
        return fail("slimrl export", f"--adapter {adapter}: the adapter does not record its base model; pass --model")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model, tokenizer = _load(base, adapter, args.load_in_4bit)
        except ValueError as err:
            return fail("slimrl export", str(err))
        print(f"slimrl export: {adapter} on {base} -> {out}", flush=True)
        try:
            export_all(model, tokenizer, out, plain, types, overwrite=args.overwrite)
        except (ExportError, ExportConflictError) as err:
            return fail("slimrl export", str(err))
        except OSError as err:  # unwritable folder, full disk: nothing partial is left (staged writes)
            return fail(
                "slimrl export",
                f"--output {out}: {err.strerror or err} while writing "
                f"({err.filename or out}); free space or choose another folder",
            )
    if args.push_to_hub:
        from slimrl.export.hub import HubError, upload_folder

        try:
            url = upload_folder(
                out, args.push_to_hub, private=args.private or None, commit_message="Upload with slimrl export"
            )
        except HubError as err:
            return fail("slimrl export", f"--push_to_hub {args.push_to_hub}: {err} (the export stays in {out})")
        print(f"slimrl export: uploaded {out} to {args.push_to_hub}: {url}", flush=True)
    return 0
