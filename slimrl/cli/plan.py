"""``slimrl plan``: predicted peak memory per phase and step time, from the model's config only (thin: the model is
:mod:`slimrl.planning`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from slimrl.cli.oneline import fail, parse


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: write true or false")


def _bool_or_auto(text: str) -> bool | None:
    return None if text.lower() == "auto" else _bool(text)


_PARSE = {"int": int, "float": float, "str": str, "bool": _bool, "bool | None": _bool_or_auto}


def _settings_options(p: argparse.ArgumentParser) -> None:
    """One ``--<field>`` per :class:`slimrl.planning.Settings` field declared as an option: its default, its type
    (a bool as true/false, an optional bool also as auto) and its help come from the field."""
    from dataclasses import fields

    from slimrl.patching.table import PLANNED
    from slimrl.planning.settings import Settings

    for f in fields(Settings):
        if "option" in f.metadata:
            text = (
                f"the trainer: {', '.join(PLANNED)} (default {f.default})"
                if f.name == "algorithm"
                else f.metadata["option"]
            )
            p.add_argument(f"--{f.name}", type=_PARSE[str(f.type)], default=f.default, help=text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slimrl plan",
        description="Predict a run's peak memory per phase and its step "
        "time before any weight loads (the model's config.json only).",
    )
    p.add_argument(
        "--model",
        default="SmolLM2-135M-Instruct",
        help="local directory, .gguf file, hub id in the local cache, or the built-in alias",
    )
    _settings_options(p)
    p.add_argument(
        "--gpu",
        default=None,
        help="plan for this GPU of slimrl's table (t4, v100, l4, a10g, rtx4090, "
        "a100-40gb, a100-80gb, h100, h200): its dtype and memory, and with --fast_inference vLLM's "
        "start-up check (implies --device cuda)",
    )
    p.add_argument(
        "--gpu_memory_utilization",
        default="0.5",
        help="the engine's share of the GPU (Unsloth's meaning: its weights included), or auto",
    )
    p.add_argument(
        "--max_seq_length", type=int, default=None, help="the engine's longest sequence (default: prompt + completion)"
    )
    p.add_argument(
        "--budget",
        default=None,
        help="memory budget, e.g. 20GB (with --gpu: the card's memory by "
        "default): adds the verdict (fits / uncertain - measure with slimrl compare / does not fit), the "
        "fastest settings and the longest completion that fit",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="also TRL alone's prediction (the installed release's head) "
        "and TRL + Liger's where liger-kernel is installed, for the same settings: peak per phase and, "
        "with --budget, the longest completion that fits",
    )
    p.add_argument("--json", action="store_true", help="the plan as one JSON object")
    return p


def format_compare(sides: dict[str, dict[str, Any]]) -> str:
    """``--compare``'s table: one column per side."""
    names = list(sides)
    phases = list(dict.fromkeys(p for side in sides.values() for p in side["phases"]))
    lines = [
        "",
        "  compared (GB; TRL's sides simulated on the meta device, see docs/plan.md):",
        "  " + f"{'':24}" + "".join(f"{n:>14}" for n in names),
    ]
    for phase in phases:
        cells = [sides[n]["phases"].get(phase) for n in names]
        lines.append(f"  {phase:24}" + "".join(f"{'-' if c is None else f'{c / 2**30:.2f}':>14}" for c in cells))
    lines.append(f"  {'peak':24}" + "".join(f"{sides[n]['peak_bytes'] / 2**30:>14.2f}" for n in names))
    ref = sides[names[1]]["peak_bytes"] if len(names) > 1 else None
    if ref:
        lines.append(f"  {'peak / TRL alone':24}" + "".join(f"{sides[n]['peak_bytes'] / ref:>14.2f}" for n in names))
    if all("train_seconds" in sides[n] for n in names):  # CUDA: slimrl.planning.cuda_pass
        lines.append(f"  {'training pass (s)':24}" + "".join(f"{sides[n]['train_seconds']:>14.3f}" for n in names))
    if "longest_completion" in sides[names[0]]:
        lines.append(
            f"  {'longest completion':24}"
            + "".join(f"{str(sides[n]['longest_completion'] or 'none'):>14}" for n in names)
        )
    return "\n".join(lines)


def format_plan(data: dict[str, Any]) -> str:
    s = data["settings"]
    lines = [
        f"slimrl plan: {s['model']}, {s['algorithm']}, {s['per_device_train_batch_size']} rows x "
        f"({s['max_prompt_length']} + {s['max_completion_length']}) tokens, LoRA r={s['lora_r']}, "
        f"checkpointing {s['gradient_checkpointing']}, {'engine' if s['fast_inference'] else 'HF generate'}, "
        f"{s['device']}" + (", each prompt once per group (shared prefix)" if s.get("shared_prefix") else ""),
        "",
        f"  {'phase':24} {'memory':>10} {'time':>9}",
    ]
    split = data["step_split"]
    parts = {k: v for k, v in split.items() if k.startswith("generation_")}  # generation's prefill and decode
    for name, nbytes in data["phases"].items():
        secs = split.get(name, sum(parts.values()) if name == "generation" and parts else None)
        lines.append(f"  {name:24} {nbytes / 2**30:8.2f} GB {'' if secs is None else f'{secs:7.1f} s'}")
        if name == "generation":
            lines += [f"    {k.removeprefix('generation_'):22} {'':>10} {v:7.1f} s" for k, v in parts.items()]
    for name, secs in split.items():  # time without a memory phase of its own (the offload's copies)
        if name not in data["phases"] and name not in parts:
            lines.append(f"  {name:24} {'':>10} {secs:7.1f} s")
    label = "max_memory_allocated" if s["device"] == "cuda" else "predicted peak"  # CUDA: the context is outside
    lines.append(f"  {label:24} {data['peak_bytes'] / 2**30:8.2f} GB {data['step_seconds']:7.1f} s/step")
    if "fits" in data:
        lines.append(
            f"\n  budget {data['budget_bytes'] / 2**30:.2f} GB: {data['verdict']}; "
            f"fastest settings that fit: {data.get('recommended')}; longest completion that fits: "
            f"{data.get('max_completion_length_that_fits')}"
        )
    lines += [f"  {note}" for note in data.get("notes", [])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(parser(), argv)
    if isinstance(args, int):  # --help (0) or a parse error (2, one line)
        return args
    import warnings

    from slimrl.errors import InputError
    from slimrl.patching.table import PLANNED
    from slimrl.planning import Settings, plan

    if args.algorithm not in PLANNED:
        return fail("slimrl plan", f"--algorithm {args.algorithm!r}: unknown; choose one of {', '.join(PLANNED)}")
    if args.compare and PLANNED[args.algorithm].trl is None:
        simulated = ", ".join(name for name, work in PLANNED.items() if work.trl is not None)
        return fail("slimrl plan", f"--compare: TRL alone is simulated for {simulated}; not {args.algorithm!r}")
    if PLANNED[args.algorithm].generates and args.per_device_train_batch_size % max(args.num_generations, 1):
        return fail(
            "slimrl plan",
            f"--per_device_train_batch_size {args.per_device_train_batch_size}: the plan is of "
            f"one generation batch of these rows, which TRL needs to be a multiple of "
            f"--num_generations {args.num_generations}",
        )
    gpu, utilization = None, args.gpu_memory_utilization
    if args.gpu is not None:
        from slimrl.compat.gpus import find_gpu

        try:
            gpu = find_gpu(args.gpu)
        except ValueError as exc:
            return fail("slimrl plan", str(exc))
        args.device = "cuda"
    try:
        utilization = utilization if utilization == "auto" else float(utilization)
        if utilization != "auto" and not 0 < utilization < 1:
            raise ValueError
    except ValueError:
        return fail(
            "slimrl plan", f"--gpu_memory_utilization {args.gpu_memory_utilization!r}: a fraction in (0, 1) or auto"
        )
    skip = ("json", "model", "budget", "compare", "gpu", "gpu_memory_utilization", "max_seq_length")
    options = {k: v for k, v in vars(args).items() if k not in skip}
    share = {} if utilization == "auto" else {"gpu_memory_utilization": utilization}
    settings = Settings(workload=PLANNED[args.algorithm], gpu=gpu.key if gpu else None, **share, **options)
    try:
        from slimrl.planning.bounds import check_plannable, check_sequence_bound
        from slimrl.planning.config import load_config

        config = load_config(args.model)
        check_plannable(config, args.model, args.load_in_4bit)  # before any trace
        check_sequence_bound(config, args.max_seq_length, args.max_prompt_length + args.max_completion_length)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = plan(args.model, settings, budget=args.budget)
    except (InputError, FileNotFoundError) as exc:
        return fail("slimrl plan", str(exc))
    except (RuntimeError, OverflowError, MemoryError) as exc:  # sizes whose tensors cannot even be described
        return fail(
            "slimrl plan",
            f"the sizes asked for are beyond what can be planned ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:120]}); ask for fewer rows or tokens",
        )
    data = result.to_json()
    if gpu is not None:
        from slimrl.planning.gpu import format_section, gpu_section

        seq = args.max_seq_length or args.max_prompt_length + args.max_completion_length
        data.update(gpu_section(config, gpu, args.fast_inference, args.load_in_4bit, args.lora_r, utilization, seq))
    if args.compare:
        try:
            sides = _compare(args, settings, result)
        except ValueError as exc:  # an InputError among them
            return fail("slimrl plan", str(exc))
        data["compare"] = sides
    text = format_plan(data) + ("\n" + format_section(data) if gpu is not None else "")
    print(json.dumps(data, indent=2) if args.json else text + (format_compare(data["compare"]) if args.compare else ""))
    return 0


def _compare(args: argparse.Namespace, settings: Any, result: Any) -> dict[str, Any]:
    import warnings

    from slimrl.planning.compare import compare
    from slimrl.planning.config import load_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compare(load_config(args.model), settings, result.budget_bytes)
