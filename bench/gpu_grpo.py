"""One GRPO step of a 1.5-8B model on one GPU: TRL 1.16 alone, TRL + Liger, slimrl and Unsloth, each side in its
own process (``slimrl/cli/compare_worker.py``, the worker ``slimrl compare`` runs).

    python bench/gpu_grpo.py --shape qwen2.5-1.5b --length 4096 --prompt-length 256            # TRL, Liger, slimrl
    python bench/gpu_grpo.py --shape qwen2.5-1.5b --length 4096 --prompt-length 256 --sides unsloth
    python bench/gpu_grpo.py --shape qwen3-8b --quant qlora --length 8192 --steps 1 --sides trl,slimrl,unsloth
    python bench/gpu_grpo.py --fit --cap-gb 24 --sides trl,trl-liger,slimrl,unsloth             # longest under 24 GB
    python bench/gpu_grpo.py --device cpu --tiny                                                # smoke test

Models are random-init from the configs in :data:`SHAPES` (nothing downloaded: memory and time do not depend on
the weights' values), saved once under ``--cache`` with a character tokenizer, then loaded by each side its own way
(``slimrl/cli/compare_worker.py``; QLoRA: an NF4 base through bitsandbytes on every side). LoRA r=64 (alpha 64) on every
projection; GRPOConfig is TRL's defaults otherwise (dapo, beta 0, gradient checkpointing on, bf16 on CUDA).

Sampling: by default ``generate`` returns ``--length`` random token ids per completion (bench code only), so the
training side is what is measured; ``--generate`` keeps HF generate (lengths forced with ``min_new_tokens``). One
prompt of ``--prompt-length`` tokens, ``--generations`` completions, one generation batch per step; ``--steps``
steps; the last step's time is reported, and the peak over all steps (``max_memory_allocated``, and reserved).

``--fit``: the longest completion that fits ``--cap-gb``, per side, from two measured lengths, a linear fit and
one confirming probe (no search): one process per side runs steps at ``lo, lo, hi`` (``--fit-lengths``; the
first is a warm-up, so both measured steps carry the optimizer's state) and their peaks give ``peak = a + b·L``;
the longest multiple of ``--fit-step`` with ``a + b·L <= --fit-margin × cap`` is then probed by one process of two
steps under the cap (on CUDA ``torch.cuda.set_per_process_memory_fraction``: past it the allocator raises out of
memory; on the CPU a probe fits when its peak RSS is under the cap). The processes of one round run side by side,
as many as the GPU holds at the cap each (each process has its own allocator and peak; their times are not used).

Beside slimrl's figures the result carries ``slimrl plan``'s prediction for the same config (peak, step time and,
with a cap, the longest completion that fits): the plan's error on this device.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
if sys.argv[1:3] == ["--worker", "unsloth"]:
    # Unsloth's worker: Unsloth before anything that imports transformers or PEFT (slimrl's package does), as
    # Unsloth requires; slimrl from this checkout, since the Unsloth process may not see this interpreter's packages
    import unsloth  # noqa: F401

    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from gpu_shapes import SHAPES, model_dir  # noqa: E402 - the bench directory is not a package
from grpo_step import RESULT_TAG  # noqa: E402

from slimrl.cli.compare_worker import UNSLOTH_SITE, run_side, unsloth_env, unsloth_python  # noqa: E402

SIDES = ("trl", "trl-liger", "slimrl", "slimrl/resident", "slimrl/noshared", "slimrl/untiled", "unsloth")


def _worker_cmd(args: argparse.Namespace, side: str, lengths: list[int], steps: int | None = None) -> list[str]:
    python = unsloth_python() if side == "unsloth" else [sys.executable]
    cmd = [
        *python,
        __file__,
        "--worker",
        side,
        "--lengths",
        ",".join(map(str, lengths)),
        "--steps",
        str(steps or args.steps),
    ]
    for name in (
        "shape",
        "quant",
        "generations",
        "prompt_length",
        "device",
        "cache",
        "cap_gb",
        "model",
        "lora_r",
        "ckpt",
    ):
        value = getattr(args, name, None)
        if value is not None:
            cmd += [f"--{name.replace('_', '-')}", str(value)]
    return cmd + (["--generate"] if getattr(args, "generate", False) else [])


def _start(args: argparse.Namespace, side: str, lengths: list[int], steps: int | None = None) -> subprocess.Popen:
    env = unsloth_env(args.device) if side == "unsloth" else None
    return subprocess.Popen(
        _worker_cmd(args, side, lengths, steps), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _collect(proc: subprocess.Popen, side: str) -> dict:
    """The JSON a worker printed; a worker that failed is a record of its exit and last lines (the others go on)."""
    out, err = proc.communicate()
    lines = [ln for ln in out.splitlines() if ln.startswith(RESULT_TAG)]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1][len(RESULT_TAG) :])
    sys.stderr.write(f"--- {side} worker failed (exit {proc.returncode})\n{out[-3000:]}{err[-6000:]}\n")
    tail = [ln for ln in (err or out).strip().splitlines() if ln.strip()][-1:] or ["no output"]
    return {"side": side, "failed": f"exit {proc.returncode}: {tail[0][:300]}"}


def run_worker(args: argparse.Namespace, side: str, length: int) -> dict:
    """``side`` at completion length ``length`` in its own process; its result dict."""
    return _collect(_start(args, side, [length]), side)


def _side_by_side(jobs: list[tuple[str, list[int], int]], args: argparse.Namespace, parallel: int) -> dict:
    """Run ``(side, lengths, steps)`` jobs, ``parallel`` processes at a time; results by side."""
    results, queue, running = {}, list(jobs), []
    while queue or running:
        while queue and len(running) < parallel:
            side, lengths, steps = queue.pop(0)
            running.append((side, _start(args, side, lengths, steps)))
        side, proc = running.pop(0)
        results[side] = _collect(proc, side)
    return results


def parallel_slots(args: argparse.Namespace) -> int:
    """How many capped processes run side by side: on CUDA as many as the GPU holds at the cap each (plus a CUDA
    context's ~1 GB), on the CPU one (its cores are the limit)."""
    if args.parallel:
        return args.parallel
    if args.device != "cuda":
        return 1
    import torch

    total_gb = torch.cuda.get_device_properties(0).total_memory / 2**30
    return max(1, int((total_gb - 2) // (args.cap_gb + 1.5)))


def linear_fit(points: dict[int, float], cap_gb: float, margin: float, step: int, hi: int) -> int | None:
    """The longest multiple of ``step`` (at most ``hi``) whose peak ``a + b·L``, fitted through the two measured
    ``{length: peak GB}`` points, is at most ``margin × cap_gb``; None when even the shorter length is over."""
    (l0, p0), (l1, p1) = sorted(points.items())
    slope = (p1 - p0) / (l1 - l0)
    if p0 > margin * cap_gb:
        return None
    if slope <= 0:
        return hi // step * step
    longest = l0 + (margin * cap_gb - p0) / slope
    return max(step, min(hi, int(longest // step * step)))


def _fit_peak(r: dict, length: int, device: str) -> float | None:
    key = "reserved_gb" if device == "cuda" else "alloc_gb"
    measured = [s[key] for s in r.get("steps", [])[1:] if s["length"] == length]  # the warm-up step left out
    return max(measured) if measured else None


def fit(args: argparse.Namespace, sides: list[str]) -> dict[str, dict]:
    """``--fit`` (module docstring): the measured points, the fitted length and its probe, per side."""
    lo, hi = (int(x) for x in args.fit_lengths.split(","))
    slots = parallel_slots(args)
    measured = _side_by_side([(s, [lo, lo, hi], 3) for s in sides], args, slots)
    out, probes = {}, []
    for side, r in measured.items():
        if "skipped" in r or "failed" in r or "oom" in r:
            out[side] = {
                "side": side,
                "longest_fit": None,
                "measured": r,
                **{k: r[k] for k in ("skipped", "failed") if k in r},
            }
            continue
        points = {lo: _fit_peak(r, lo, args.device), hi: _fit_peak(r, hi, args.device)}
        predicted = linear_fit(points, args.cap_gb, args.fit_margin, args.fit_step, args.fit_max)
        out[side] = {"side": side, "points_gb": points, "predicted": predicted, "longest_fit": None}
        if predicted:
            probes.append((side, [predicted, predicted], 2))
    for side, probe in _side_by_side(probes, args, slots).items():
        fits = bool(probe.get("fits")) and "failed" not in probe
        out[side].update(
            probe=probe,
            longest_fit=out[side]["predicted"] if fits else None,
            confirmed=fits,
            peak_gb=probe.get("peak_gb"),
            reserved_gb=probe.get("reserved_gb"),
        )
    return out


def plan_prediction(args: argparse.Namespace, path: str, length: int) -> dict:
    """``slimrl plan`` for the config slimrl ran (with ``--cap-gb``: the longest completion it predicts fits)."""
    import warnings

    try:
        from slimrl.planning import Settings, plan

        settings = Settings(
            per_device_train_batch_size=args.generations,
            num_generations=args.generations,
            max_prompt_length=args.prompt_length,
            max_completion_length=length,
            lora_r=args.lora_r,
            load_in_4bit=args.quant == "qlora",
            gradient_checkpointing=args.ckpt,
            device=args.device,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p = plan(path, settings, budget=f"{args.cap_gb}GB" if args.cap_gb else None)
    except Exception as exc:  # noqa: BLE001 - a prediction that cannot be made is said, the measurement stays
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return {
        "peak_gb": p.peak_bytes / 2**30,
        "step_s": p.step_seconds,
        **({"longest_fit": p.max_completion_length_that_fits} if args.cap_gb else {}),
    }


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    ap.add_argument("--tiny", action="store_true", help="the tiny shape, short lengths (smoke test)")
    ap.add_argument(
        "--model",
        default=None,
        help="a real model (path, hub id in the cache or the alias) instead of a random-init shape",
    )
    ap.add_argument("--lora-r", type=int, default=64)
    ap.add_argument(
        "--ckpt",
        choices=["slimrl", "selective", "true", "false"],
        default="slimrl",
        help="slimrl's use_gradient_checkpointing (slimrl sides); false also turns TRL's off",
    )
    ap.add_argument("--quant", choices=["bf16", "qlora"], default="bf16")
    ap.add_argument("--sides", default=",".join(SIDES[:3]))
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--length", type=int, default=None, help="completion tokens (2048; 16 with --tiny)")
    ap.add_argument("--lengths", default=None, help=argparse.SUPPRESS)  # a worker's per-step lengths
    ap.add_argument("--prompt-length", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--cache", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "slimrl-gpu-models"))
    ap.add_argument("--generate", action="store_true", help="keep HF generate (forced lengths)")
    ap.add_argument("--fit", action="store_true", help="longest completion length that fits --cap-gb")
    ap.add_argument("--cap-gb", type=float, default=None)
    ap.add_argument("--fit-lengths", default="1024,2048", help="lo,hi: the two measured lengths of --fit")
    ap.add_argument("--fit-step", type=int, default=256, help="the fitted length is a multiple of this")
    ap.add_argument("--fit-max", type=int, default=32768, help="the longest length --fit predicts")
    ap.add_argument(
        "--fit-margin",
        type=float,
        default=0.97,
        help="the fit aims at this share of the cap (the allocator's fragmentation)",
    )
    ap.add_argument(
        "--parallel",
        type=int,
        default=None,
        help="--fit's processes side by side (default: as many as the GPU holds at the cap)",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    if args.tiny:
        args.shape = "tiny"
    if args.length is None:
        args.length = 16 if args.shape == "tiny" else 2048
    args.lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else [args.length]
    if args.worker:
        path = _path(args) if args.model else os.path.join(args.cache, _dir_name(args))
        print(RESULT_TAG + json.dumps(run_side(args, path)), flush=True)
        return {}
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device here; use --device cpu (with --tiny for a smoke test)")
    if args.fit and not args.cap_gb:
        raise SystemExit("--fit needs --cap-gb (the memory cap, e.g. --cap-gb 24)")
    sides = args.sides.split(",")
    unknown = set(sides) - set(SIDES)
    if unknown:
        raise SystemExit(f"--sides: unknown {sorted(unknown)}; choose from {', '.join(SIDES)}")
    path = _path(args) if args.model else model_dir(args.shape, args.cache, args.device)  # before any side runs
    started = time.perf_counter()
    results: dict = fit(args, sides) if args.fit else {side: run_worker(args, side, args.length) for side in sides}
    results["config"] = {
        "shape": args.shape,
        "quant": args.quant,
        "generations": args.generations,
        "prompt_length": args.prompt_length,
        "length": None if args.fit else args.length,
        "cap_gb": args.cap_gb,
        "lora_r": args.lora_r,
        "steps": args.steps,
        "device": args.device,
        "unsloth_site": UNSLOTH_SITE if "unsloth" in sides else None,
        "seconds": round(time.perf_counter() - started, 1),
    }
    if any(s.startswith("slimrl") for s in sides):
        results["plan"] = plan_prediction(args, path, args.length)
    _print(args, results)
    print(RESULT_TAG + json.dumps(results))
    return results


def _dir_name(args: argparse.Namespace) -> str:
    return f"{args.shape}-{'bfloat16' if args.device == 'cuda' else 'float32'}"


def _path(args: argparse.Namespace) -> str:
    from slimrl.models.loader import resolve_model_path

    return str(resolve_model_path(args.model))


def _print(args: argparse.Namespace, results: dict) -> None:
    base_dtype = "NF4" if args.quant == "qlora" else "bf16" if args.device == "cuda" else "fp32"
    print(
        f"GRPO step, {args.shape} ({base_dtype} base, LoRA r={args.lora_r}), {args.generations} x "
        f"{'fit under ' + str(args.cap_gb) + ' GB' if args.fit else args.length} tokens, prompt "
        f"{args.prompt_length}, {'HF generate' if args.generate else 'random completions'}, device {args.device}"
    )
    base = results.get("trl", {})
    for side, r in results.items():
        if not isinstance(r, dict) or "side" not in r:
            continue
        if "skipped" in r or "failed" in r:
            print(f"{side:16} {'skipped' if 'skipped' in r else 'failed'}: {r.get('skipped') or r.get('failed')}")
        elif args.fit:
            ratio = (
                f"  {r['longest_fit'] / base['longest_fit']:.2f}x trl"
                if side != "trl" and r["longest_fit"] and base.get("longest_fit")
                else ""
            )
            print(
                f"{side:16} points {r.get('points_gb')} -> {r.get('predicted')} tokens, probe "
                f"{'fits' if r.get('confirmed') else 'does not fit'}: longest {r['longest_fit']}{ratio}"
            )
        elif "oom" in r:
            print(f"{side:16} out of memory: {r['oom']}")
        else:
            line = (
                f"{side:16} peak {r['peak_gb']:7.2f} GB (reserved {r['reserved_gb']:.2f})  "
                f"{r['step_s'][-1]:8.2f} s/step  loss {r['loss']}"
            )
            if side != "trl" and base.get("peak_gb"):
                line += (
                    f"  (memory {r['peak_gb'] / base['peak_gb']:.2f}x, "
                    f"time {r['step_s'][-1] / base['step_s'][-1]:.2f}x trl)"
                )
            print(line)
    if "plan" in results:
        print(f"slimrl plan predicted: {results['plan']}")


if __name__ == "__main__":
    main()
