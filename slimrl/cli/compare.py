"""``slimrl compare``: TRL alone vs slimrl (and TRL + Liger where installed) measured on your model, your settings
and your device, each side in its own process (thin: the sides are :mod:`slimrl.cli.compare_worker`).

Every side trains GRPO ``--steps`` steps from the same seed on the same prompt; by default the completions are
random tokens of exactly ``--max_completion_length`` (``--generate``: real generation), so the sides score the same
lengths. Per side: the peak memory of a step (CUDA: ``max_memory_allocated`` and the reserved peak; CPU: peak RSS),
the last step's time, the first step's loss (which TRL alone and slimrl must agree on), and ``slimrl plan``'s
prediction beside the measured figures. A side that fails or runs out of memory is reported; the others go on. One
table, and with ``--json FILE`` the whole record (versions and device included) for a bug report.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from slimrl.cli.oneline import fail, parse
from slimrl.compat.runtime.atomic_write import write_atomically
from slimrl.compat.runtime.processes import die_with_parent

SIDES = ("trl", "slimrl", "trl-liger")
LOSS_RTOL = {"cpu": 1e-3, "cuda": 5e-2}  # first-step losses: fp32 sums in other orders; bf16 on CUDA


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slimrl compare",
        description="Measure TRL alone vs slimrl (and TRL + Liger) "
        "on your model and device: peak memory, step time, first-step loss.",
    )
    p.add_argument("--model", default="SmolLM2-135M-Instruct", help="local directory, hub id in the cache or alias")
    p.add_argument(
        "--sides",
        default=None,
        help="comma-separated, from trl, slimrl, trl-liger (default: all three on CUDA, trl,slimrl on the CPU)",
    )
    p.add_argument("--num_generations", type=int, default=8, help="completions per step (one prompt's group)")
    p.add_argument("--max_prompt_length", type=int, default=128)
    p.add_argument("--max_completion_length", type=int, default=512)
    p.add_argument("--lora_r", type=int, default=64)
    p.add_argument(
        "--gradient_checkpointing",
        default="slimrl",
        choices=("slimrl", "selective", "true", "false"),
        help="slimrl's side (TRL's sides use TRL's own, on unless false)",
    )
    p.add_argument("--load_in_4bit", action="store_true", help="an NF4 base on every side (bitsandbytes, CUDA)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda where there is one)")
    p.add_argument("--generate", action="store_true", help="generate for real (the lengths are then the model's)")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per side")
    p.add_argument("--json", default=None, help="write the record to this file")
    return p


def _check(args: argparse.Namespace) -> str | None:
    for name in ("num_generations", "max_prompt_length", "max_completion_length", "lora_r", "steps", "timeout"):
        if getattr(args, name) < 1:
            return f"--{name} {getattr(args, name)}: must be at least 1"
        if name != "timeout" and getattr(args, name) > 2**20:  # before the model loads: no run is this large
            return f"--{name} {getattr(args, name)}: larger than any run ({2**20:,} at most)"
    unknown = [s for s in args.sides if s not in SIDES]
    if unknown:
        return f"--sides {','.join(unknown)}: unknown; choose from {', '.join(SIDES)}"
    if args.device not in ("cuda", "cpu"):
        return f"--device {args.device!r}: choose cuda or cpu"
    if args.timeout > 7 * 24 * 3600:
        return f"--timeout {args.timeout}: seconds per side, at most a week ({7 * 24 * 3600})"
    return _json_destination(args.json)


def _json_destination(path: str | None) -> str | None:
    """Why the record could not be written to ``--json`` (checked before any side runs: the results would be
    lost after minutes of work); None: it can."""
    if path is None:
        return None
    import stat
    from pathlib import Path

    target = Path(path).expanduser()
    if not target.parent.is_dir():
        return f"--json {path}: the folder {target.parent} does not exist; create it or choose another file"
    if target.exists() and not stat.S_ISREG(target.stat().st_mode):
        return f"--json {path}: not a regular file (a folder, FIFO or device); choose a file name"
    if not os.access(target if target.exists() else target.parent, os.W_OK):
        return f"--json {path}: cannot write there; choose a writable place"
    return None


def worker_command(args: argparse.Namespace, side: str, path: str) -> list[str]:
    """The worker process of ``side`` (:mod:`slimrl.cli.compare_worker`)."""
    return [
        sys.executable,
        "-m",
        "slimrl.cli.compare_worker",
        "--worker",
        side,
        "--model",
        path,
        "--lengths",
        str(args.max_completion_length),
        "--steps",
        str(args.steps),
        "--generations",
        str(args.num_generations),
        "--prompt-length",
        str(args.max_prompt_length),
        "--lora-r",
        str(args.lora_r),
        "--ckpt",
        args.gradient_checkpointing,
        "--quant",
        "qlora" if args.load_in_4bit else "bf16",
        "--device",
        args.device,
        *(["--generate"] if args.generate else []),
    ]


def run_sides(sides: list[str], command, timeout: int) -> dict[str, dict]:
    """Each side's record, one process at a time (``command(side)`` is its command line): a side that exits badly,
    times out or prints nothing is a record of that, and the next side runs."""
    from slimrl.cli.compare_worker import RESULT_TAG

    results = {}
    for side in sides:
        try:
            done = subprocess.run(
                command(side), capture_output=True, text=True, timeout=timeout, preexec_fn=die_with_parent
            )  # a killed compare leaves no worker holding memory
        except subprocess.TimeoutExpired:
            results[side] = {"side": side, "failed": f"no result within {timeout} s"}
            continue
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith(RESULT_TAG)]
        if done.returncode == 0 and lines:
            results[side] = json.loads(lines[-1][len(RESULT_TAG) :])
            continue
        text = done.stderr or done.stdout
        tail = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or ["no output"]
        oom = "out of memory" in text.lower() or "outofmemoryerror" in text.lower()
        results[side] = {
            "side": side,
            **({"oom": tail[0][:300]} if oom else {"failed": f"exit {done.returncode}: {tail[0][:300]}"}),
        }
    return results


def prediction(args: argparse.Namespace, path: str) -> dict[str, Any]:
    """``slimrl plan`` for slimrl's side (``--compare``: and TRL's), or why there is none."""
    import warnings

    try:
        from slimrl.patching.table import PLANNED
        from slimrl.planning import Settings, plan
        from slimrl.planning.compare import compare

        s = Settings(
            workload=PLANNED["grpo"],
            per_device_train_batch_size=args.num_generations,
            num_generations=args.num_generations,
            max_prompt_length=args.max_prompt_length,
            max_completion_length=args.max_completion_length,
            lora_r=args.lora_r,
            load_in_4bit=args.load_in_4bit,
            device=args.device,
            gradient_checkpointing=args.gradient_checkpointing,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from slimrl.planning.config import load_config

            sides = compare(load_config(path), s)
            return {side: {"peak_gb": v["peak_bytes"] / 2**30} for side, v in sides.items()} | {
                "slimrl_step_s": plan(path, s, search=False).step_seconds
            }
    except Exception as exc:  # noqa: BLE001 - a prediction that cannot be made is said; the measurements stay
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def agreement(results: dict[str, dict], device: str) -> str | None:
    """Whether TRL alone's and slimrl's first step agree: its loss and its gradient norm (GRPO's first loss is often
    0 exactly; the gradient is not). None: one of the sides has no figures."""
    tol, parts, ok = LOSS_RTOL[device], [], True
    for key in ("first_loss", "first_grad_norm"):
        a, b = (results.get(s, {}).get(key) for s in ("trl", "slimrl"))
        if a is None or b is None:
            return None
        ok &= abs(a - b) <= tol * max(abs(a), 1e-6) + 1e-6
        parts.append(f"{key.removeprefix('first_').replace('_', ' ')} {a:.6g} vs {b:.6g}")
    return f"{'agree' if ok else 'DIFFER'}: {', '.join(parts)} (tolerance {tol:g} relative)"


def table(results: dict[str, dict], predicted: dict[str, Any]) -> str:
    lines = [f"  {'side':10} {'peak GB':>9} {'reserved':>9} {'s/step':>8} {'loss':>10} {'predicted GB':>13}"]
    base = results.get("trl", {}).get("peak_gb")
    for side, r in results.items():
        if "skipped" in r or "failed" in r or "oom" in r:
            what = "skipped" if "skipped" in r else "out of memory" if "oom" in r else "failed"
            lines.append(f"  {side:10} {what}: {r.get('skipped') or r.get('oom') or r.get('failed')}")
            continue
        pred = predicted.get(side.replace("trl-liger", "trl + liger"), {}).get("peak_gb")
        ratio = f"  ({r['peak_gb'] / base:.2f}x TRL alone)" if base and side != "trl" else ""
        lines.append(
            f"  {side:10} {r['peak_gb']:9.2f} {r['reserved_gb']:9.2f} {r['step_s'][-1]:8.2f} "
            f"{'-' if r.get('first_loss') is None else format(r['first_loss'], '.4g'):>10} "
            f"{'-' if pred is None else f'{pred:.2f}':>13}{ratio}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(parser(), argv)
    if isinstance(args, int):
        return args
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.sides = (args.sides or ",".join(SIDES if args.device == "cuda" else SIDES[:2])).split(",")
    problem = _check(args)
    if problem:
        return fail("slimrl compare", problem)
    if args.device == "cuda" and not torch.cuda.is_available():
        return fail("slimrl compare", "--device cuda: no CUDA device here; use --device cpu")
    from slimrl.models.loader import resolve_model_path

    try:
        path = str(resolve_model_path(args.model))
    except (OSError, ValueError) as exc:
        return fail("slimrl compare", f"--model {args.model}: {exc}")
    started = time.perf_counter()
    results = run_sides(args.sides, lambda side: worker_command(args, side, path), args.timeout)
    predicted = prediction(args, path)
    loss = agreement(results, args.device)
    print(
        f"slimrl compare: {args.model}, GRPO, {args.num_generations} x ({args.max_prompt_length} + "
        f"{args.max_completion_length}) tokens, LoRA r={args.lora_r}{', NF4 base' if args.load_in_4bit else ''}, "
        f"{'generated' if args.generate else 'random'} completions, {args.steps} steps, {args.device}"
    )
    print(table(results, predicted))
    if loss:
        print(f"  first step, TRL alone vs slimrl: {loss}")
    record = {
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "sides": results,
        "predicted": predicted,
        "loss_agreement": loss,
        "seconds": round(time.perf_counter() - started, 1),
    }
    if args.json:
        write_atomically(Path(args.json), json.dumps(record, indent=1))  # a kill mid-write keeps the old record
        print(f"  record: {args.json}")
    incomplete = [side for side, r in results.items() if "failed" in r or "oom" in r]
    if incomplete:
        print(f"  not measured: {', '.join(incomplete)} (exit 1)")
    return 1 if (loss and loss.startswith("DIFFER")) or incomplete else 0
