"""Staged runner for a lent GPU machine: every GPU figure in three short commands, each inside one device call.

On the GPU machine (a copy of this repository with ``.gpu-wheels/`` from ``make gpu-wheels``; results under ``$OUT``):

    bash bench/gpu_run.sh setup+tests     # install the carried wheels if needed, versions, slimrl doctor, tests/gpu
    bash bench/gpu_run.sh bench-a         # 1.5B shape: longest completion under 24 GB, step time, log-prob kernels
    bash bench/gpu_run.sh bench-b         # 3B shape, 8B QLoRA long completion, offloaded vs resident checkpointing

Here (``make test`` rehearses every stage of the same steps with ``--device cpu --tiny``):

    python bench/gpu_run.py all --device cpu --tiny --out /tmp/rehearsal

Each stage re-runs setup only when an import it needs fails, runs its steps one after another, each in its own
process under its own time limit (a step over it is killed and recorded as ``timed_out``), goes on past a failed
step, skips a step that could not finish inside the stage's budget, and writes two files under ``--out``:
``<stage>.json`` (device, versions, and per step: command, exit code, seconds, the bench's JSON result) and
``<stage>.log`` (every step's output). ``bench/gpu_report.py`` turns the JSON files into BENCHMARKS.md rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT_TAG = "BENCH_RESULT "  # what bench/gpu_grpo.py and bench/gpu_logprob.py print before their JSON
STAGE_BUDGET_S = 540  # one device call may run 600 s: the stage stops starting steps past this
MAX_FILES, MAX_FILE_BYTES = 8, 16 * 2**20  # what one device call brings back


@dataclass(frozen=True)
class Step:
    """One command of a stage and its time limit on the GPU (``rehearsal_limit_s`` on this CPU)."""

    name: str
    argv: tuple[str, ...]
    limit_s: int
    rehearsal_limit_s: int = 240


def _grpo(*args: str) -> tuple[str, ...]:
    return ("{py}", "bench/gpu_grpo.py", *args)


def steps(stage: str, tiny: bool) -> list[Step]:
    """The steps of ``stage``; ``tiny``: the rehearsal's shapes and lengths (same scripts, same flags otherwise)."""
    dev = ("--device", "cpu", "--tiny", "--generations", "2", "--steps", "1") if tiny else ()

    def length(n: int) -> tuple[str, ...]:
        return ("--length", "12") if tiny else ("--length", str(n))

    fit = ("--fit-range", "16:16", "--fit-step", "16", "--cap-gb", "64") if tiny else \
        ("--fit-range", "1024:16384", "--fit-step", "1024", "--cap-gb", "24")
    table = {
        "setup+tests": [
            Step("doctor", ("{py}", "-m", "slimrl", "doctor"), 60),
            Step("test-gpu", ("{py}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/gpu"), 300),
        ],
        "bench-a": [
            Step("fit-24gb", _grpo("--shape", "qwen2.5-1.5b", "--fit", *fit, "--sides", "trl,trl-liger,slimrl", *dev),
                 280),
            Step("step-time", _grpo("--shape", "qwen2.5-1.5b", *length(4096), "--sides", "trl,trl-liger,slimrl",
                                    *dev), 150),
            Step("kernels", ("{py}", "bench/gpu_logprob.py", "--shape", "qwen2.5-1.5b",
                             *(("--device", "cpu", "--tiny", "--repeats", "1") if tiny else ())), 90),
        ],
        "bench-b": [
            Step("3b", _grpo("--shape", "llama-3.2-3b", *length(4096), "--sides", "trl,slimrl", *dev), 180),
            Step("8b-qlora", _grpo("--shape", "qwen3-8b", "--quant", "qlora", *length(14336), "--sides", "slimrl",
                                   *dev), 200),
            Step("offload", _grpo("--shape", "qwen2.5-1.5b", *length(8192), "--sides", "slimrl,slimrl/resident",
                                  *dev), 150),
        ],
    }
    return table[stage]


STAGES = ("setup+tests", "bench-a", "bench-b")
NEEDED = ("trl", "datasets", "slimrl", "peft", "accelerate")


def probe(py: str) -> dict:
    """What ``py`` sees, in one process: the modules of :data:`NEEDED` it cannot import (``missing``: then setup
    runs), torch, transformers, trl, peft, accelerate, slimrl versions and the device name."""
    code = ("import json, importlib, importlib.metadata as m, torch\n"
            "v = {'missing': []}\n"
            f"for name in {NEEDED!r}:\n"
            "    try: importlib.import_module(name)\n"
            "    except Exception: v['missing'].append(name)\n"
            "for p in ('torch', 'transformers', 'trl', 'peft', 'accelerate', 'slimrl'):\n"
            "    try: v[p] = m.version(p)\n"
            "    except m.PackageNotFoundError: v[p] = None\n"
            "v['device'] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'\n"
            "print(json.dumps(v))")
    out = subprocess.run([py, "-c", code], capture_output=True, text=True)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"missing": list(NEEDED), "error": (out.stderr.strip().splitlines() or ["no output"])[-1]}


def run_step(step: Step, py: str, log, limit_s: int) -> dict:
    """Run one step under ``limit_s`` seconds, its output appended to ``log``; its record."""
    cmd = [a.replace("{py}", py) for a in step.argv]
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
    results = [ln[len(RESULT_TAG):] for ln in out.splitlines() if ln.startswith(RESULT_TAG)]
    if results:
        try:
            record["result"] = json.loads(results[-1])
        except ValueError:
            record["result"] = None
    return record


def run_stage(stage: str, out: Path, py: str, tiny: bool) -> dict:
    """One stage (module docstring); returns what it wrote to ``<stage>.json``."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    report: dict = {"stage": stage, "tiny": tiny, "steps": []}
    with open(out / f"{stage}.log", "w") as log:
        seen = probe(py)
        if not seen["missing"]:
            report["setup"] = "already installed"
        else:
            setup = Step("setup", ("bash", "bench/gpu_setup.sh"), 120)
            report["setup"] = run_step(setup, py, log, setup.limit_s)
            seen = probe(py)
        report["versions"] = {k: v for k, v in seen.items() if k != "missing"}
        for step in steps(stage, tiny):
            limit = step.rehearsal_limit_s if tiny else step.limit_s
            left = STAGE_BUDGET_S - (time.perf_counter() - started)
            if not tiny and left < limit:
                report["steps"].append({"name": step.name, "skipped": f"{left:.0f} s left of the stage's budget, "
                                                                      f"the step may take {limit} s"})
                continue
            report["steps"].append(run_step(step, py, log, limit))
    report["seconds"] = round(time.perf_counter() - started, 1)
    (out / f"{stage}.json").write_text(json.dumps(report, indent=1))
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
            print(f"{stage:12} {s['name']:10} {state:10} {s.get('seconds', 0):7.1f} s", flush=True)
            failed += state not in ("exit 0",)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
