"""The GPU runner: every GPU figure in two prepared commands that fit one 15-minute lease (its start included).

On the GPU machine (a copy of this repository with ``.gpu-wheels/`` from ``make gpu-wheels``; results under ``$OUT``):

    bash bench/gpu_run.sh A   # <= 420 s: slimrl's wheels, doctor, CUDA correctness (verify rows, tests/gpu),
                              #   then the headline:
                              #   Qwen2.5-1.5B shape, bf16 LoRA r=64, 8 x 4,096: TRL alone, TRL + Liger, slimrl
    bash bench/gpu_run.sh B   # <= 300 s: Unsloth's wheels into their own folder, Unsloth on the headline config,
                              #   slimrl with each default off in turn (where its step time goes), the longest
                              #   completion under 24 GB per side

Ordered by value: A's correctness checks come first (a wrong number is worse than none), then the headline; B's
Unsloth headline first, then the attribution, then the 24 GB fit. The first lease (an H200, docs/BENCHMARKS.md
"GPU") showed the Qwen3-8B QLoRA 8 x 8,192 row cannot share it: creating and saving the 16 GB random-init copy
printed nothing in 125 s, so that row runs alone (``python3 bench/gpu_grpo.py --shape qwen3-8b --quant qlora
--length 8192 --prompt-length 256 --generations 8 --steps 1 --sides trl,slimrl,unsloth``). Here (``make test``) both
are rehearsed with tiny shapes on the CPU, Unsloth imported from its carry set through a view of the GPU machine's
packages:

    python bench/gpu_run.py all --device cpu --tiny --out /tmp/rehearsal

A stage installs a carry set only when an import it needs fails (a warm machine keeps what the previous command
installed), then runs its steps one after another, each in its own process under its own time limit (a step over
it is killed and recorded as ``timed_out``); it goes on past a failed step. The limits of a stage's steps add up to
at most its budget, so every step gets its share (the last ones included) or says why not: skipped when less than
its ``min_s`` is left, or when it needs 4-bit and bitsandbytes has no build for the CUDA the machine's torch
reports (one line naming both). After every step it rewrites ``<stage>.json`` (device, versions, and
per step: command, exit code, seconds, the bench's JSON result) beside ``<stage>.log`` (every step's output), so a
command cut short still leaves its figures. ``bench/gpu_report.py`` turns the JSON files into BENCHMARKS.md rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT_TAG = "BENCH_RESULT "  # what the benches print before their JSON
BUDGET_S = {"A": 420, "B": 300}  # each stage's command time (issue: A <= 420 s, B <= 300 s)
MAX_FILES, MAX_FILE_BYTES = 8, 16 * 2**20  # what one device call brings back
STAGES = ("A", "B")
NEEDED = ("trl", "datasets", "slimrl", "peft", "accelerate")


@dataclass(frozen=True)
class Step:
    """One command of a stage: its time limit on the GPU, the least time worth starting it with, and its limit on
    this CPU (``rehearsal_limit_s``)."""

    name: str
    argv: tuple[str, ...]
    limit_s: int
    min_s: int = 20
    rehearsal_limit_s: int = 240
    needs_4bit: bool = False


def _grpo(*args: str) -> tuple[str, ...]:
    return ("{py}", "bench/gpu_grpo.py", *args)


def _verify(*args: str) -> tuple[str, ...]:
    return ("{py}", "-m", "slimrl", "verify", "--tiny", "--device", "{device}", "--quiet", *args)


def steps(stage: str, tiny: bool) -> list[Step]:
    """The steps of ``stage``; ``tiny``: the rehearsal's shapes and lengths (same scripts, same flags otherwise)."""
    small = ("--device", "cpu", "--tiny", "--generations", "2", "--prompt-length", "16")
    headline = (
        (*small, "--length", "12")
        if tiny
        else ("--shape", "qwen2.5-1.5b", "--length", "4096", "--prompt-length", "256", "--generations", "8")
    )
    fit = (
        (*small, "--cap-gb", "64", "--fit-lengths", "8,16", "--fit-step", "8", "--fit-max", "32")
        if tiny
        else (
            "--shape",
            "qwen2.5-1.5b",
            "--prompt-length",
            "256",
            "--generations",
            "8",
            "--cap-gb",
            "24",
            "--fit-lengths",
            "1024,2048",
            "--fit-step",
            "256",
        )
    )
    table = {
        "A": [
            Step("doctor", ("{py}", "-m", "slimrl", "doctor"), 25, 10),
            # bf16 on CUDA (fp32 in the rehearsal): loss, every LoRA gradient and the update vs TRL alone
            Step("parity-grpo", _verify("--algorithm", "grpo", "--loss_type", "dapo"), 40, 15),
            # DPO on a GPU: TRL's Triton kernel serves its head by design; with a chunking chosen, slimrl's op does
            Step("parity-dpo", _verify("--algorithm", "dpo", "--loss_type", "sigmoid"), 30, 15),
            Step(
                "parity-dpo-chunked",
                _verify("--algorithm", "dpo", "--loss_type", "sigmoid", "--unsloth_num_chunks", "4"),
                30,
                15,
            ),
            Step(
                "parity-4bit",
                _verify("--algorithm", "grpo", "--loss_type", "dapo", "--load_in_4bit"),
                35,
                20,
                needs_4bit=True,
            ),
            # every CUDA test: offloaded checkpointing's exactness, the shared-prefix kernels, PyTorch's dispatch
            Step("gpu-tests", ("{py}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/gpu"), 70, 20),
            # the Unsloth notebooks' engine arguments on this card's real free memory (vLLM's check where installed)
            Step(
                "engine-args",
                ("{py}", "bench/gpu_engine_args.py", *(("--device", "cpu", "--gpu", "t4") if tiny else ())),
                30,
                5,
            ),
            # slimrl compare (each side its own process, the plan's prediction beside), on the shape's copy
            Step(
                "headline",
                ("{py}", "bench/gpu_compare.py", *headline, "--sides", "trl,trl-liger,slimrl", "--steps", "2"),
                160,
                120,
            ),
        ],
        "B": [
            Step(
                "unsloth-setup",
                (
                    "{py}",
                    "bench/gpu_unsloth.py",
                    "--wheels",
                    ".gpu-wheels/unsloth",
                    "--target",
                    *(("{tmp}/unsloth-py312", "--python", "3.12") if tiny else ("{site}",)),
                ),
                15,
                5,
            ),
            Step("unsloth-headline", _grpo(*headline, "--sides", "unsloth", "--steps", "2"), 95, 60),
            # where slimrl's step time goes: each of its defaults turned off in turn, same config
            Step(
                "attribution",
                _grpo(*headline, "--sides", "slimrl/noshared,slimrl/resident,slimrl/untiled", "--steps", "2"),
                115,
                60,
            ),
            Step("fit-24gb", _grpo(*fit, "--fit", "--sides", "trl,trl-liger,slimrl,unsloth"), 75, 50),
        ],
    }
    return table[stage]


def probe(py: str) -> dict:
    """What ``py`` sees, in one process: the modules of :data:`NEEDED` it cannot import (``missing``: then setup
    runs), torch, transformers, trl, peft, accelerate, slimrl versions and the device name."""
    code = (
        "import json, importlib, importlib.metadata as m, torch\n"
        "v = {'missing': []}\n"
        f"for name in {NEEDED!r}:\n"
        "    try: importlib.import_module(name)\n"
        "    except Exception: v['missing'].append(name)\n"
        "for p in ('torch', 'transformers', 'trl', 'peft', 'accelerate', 'slimrl'):\n"
        "    try: v[p] = m.version(p)\n"
        "    except m.PackageNotFoundError: v[p] = None\n"
        "v['device'] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'\n"
        "try:\n"
        "    import bitsandbytes.cextension as c\n"
        "    loaded = not isinstance(c.lib, c.ErrorHandlerMockBNBNativeLibrary)\n"
        "    v['bnb'] = None if loaded else f'bitsandbytes has no build for CUDA {torch.version.cuda}'\n"
        "except Exception as e:\n"
        "    v['bnb'] = f'bitsandbytes does not import ({type(e).__name__}: {e})'\n"
        "print(json.dumps(v))"
    )
    out = subprocess.run([py, "-c", code], capture_output=True, text=True)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"missing": list(NEEDED), "error": (out.stderr.strip().splitlines() or ["no output"])[-1]}


def run_step(step: Step, fill: dict[str, str], log, limit_s: int) -> dict:
    """Run one step under ``limit_s`` seconds, its output appended to ``log``; its record."""
    cmd = list(step.argv)
    for key, value in fill.items():  # {py}, {device}, {tmp}, {site}: also inside a ``bash -c`` line
        cmd = [a.replace("{" + key + "}", value) for a in cmd]
    log.write(f"\n===== {step.name}: {shlex.join(cmd)} (limit {limit_s} s)\n")
    log.flush()
    t0 = time.perf_counter()
    record: dict = {"name": step.name, "cmd": shlex.join(cmd), "limit_s": limit_s}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit_s)
        out, record["rc"], record["timed_out"] = proc.stdout + proc.stderr, proc.returncode, False
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or b"").decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        record["rc"], record["timed_out"] = None, True
    record["seconds"] = round(time.perf_counter() - t0, 1)
    log.write(out[-200_000:])  # a runaway log cannot grow the stage's files past what comes back
    log.flush()
    results = [ln[len(RESULT_TAG) :] for ln in out.splitlines() if ln.startswith(RESULT_TAG)]
    if results:
        try:
            record["result"] = json.loads(results[-1])
        except ValueError:
            record["result"] = None
    return record


def skip_reason(step: Step, seen: dict, left: float, tiny: bool, budget: int) -> str | None:
    """Why ``step`` does not run (one line), or None: 4-bit without a bitsandbytes build for this CUDA, or less than
    its ``min_s`` left of the stage's budget (never in the rehearsal, whose limits are its own)."""
    if step.needs_4bit and seen.get("bnb"):
        return f"4-bit steps need bitsandbytes' CUDA library: {seen['bnb']}"
    if not tiny and left < step.min_s:
        return f"{left:.0f} s left of the stage's {budget} s, the step needs {step.min_s}"
    return None


def run_stage(stage: str, out: Path, py: str, tiny: bool) -> dict:
    """One stage (module docstring); returns what it wrote to ``<stage>.json``."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    report: dict = {"stage": stage, "tiny": tiny, "budget_s": BUDGET_S[stage], "steps": []}
    fill = {
        "py": py,
        "device": "cpu" if tiny else "cuda",
        "tmp": tempfile.mkdtemp(prefix="slimrl-gpu-run-"),
        "site": os.environ.get("SLIMRL_UNSLOTH_SITE", "/tmp/slimrl-unsloth-site"),
    }
    path = out / f"{stage}.json"
    with open(out / f"{stage}.log", "w") as log:
        seen = probe(py)
        if not seen["missing"]:
            report["setup"] = "already installed"
        else:
            setup = Step("setup", ("bash", "bench/gpu_setup.sh"), 120)
            report["setup"] = run_step(setup, fill, log, setup.limit_s)
            seen = probe(py)
        report["versions"] = {k: v for k, v in seen.items() if k != "missing"}
        for step in steps(stage, tiny):
            left = BUDGET_S[stage] - (time.perf_counter() - started)
            why = skip_reason(step, seen, left, tiny, BUDGET_S[stage])
            if why:
                print(f"{stage} {step.name}: skipped: {why}", file=log, flush=True)
                report["steps"].append({"name": step.name, "skipped": why})
            else:
                limit = step.rehearsal_limit_s if tiny else int(min(step.limit_s, left))
                report["steps"].append(run_step(step, fill, log, limit))
            report["seconds"] = round(time.perf_counter() - started, 1)
            path.write_text(json.dumps(report, indent=1))
    report["seconds"] = round(time.perf_counter() - started, 1)
    path.write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=(*STAGES, "all"))
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-results"), help="result folder (default: $OUT)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the rehearsal's shapes (with --device cpu)")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args(argv)
    if args.tiny != (args.device == "cpu"):
        raise SystemExit("--device cpu goes with --tiny (the rehearsal) and --device cuda without it")
    failed = 0
    for stage in STAGES if args.stage == "all" else (args.stage,):
        report = run_stage(stage, Path(args.out), args.python, args.tiny)
        for s in report["steps"]:
            state = s.get("skipped") and "skipped" or ("timed out" if s.get("timed_out") else f"exit {s['rc']}")
            print(f"{stage:2} {s['name']:18} {state:10} {s.get('seconds', 0):7.1f} s", flush=True)
            failed += state not in ("exit 0",)
        print(f"{stage:2} {'(stage)':18} {'':10} {report['seconds']:7.1f} s of {BUDGET_S[stage]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
