"""BENCHMARKS.md rows from the staged GPU runner's results (``bench/gpu_run.py``):

    python bench/gpu_report.py RESULTS_DIR [RESULTS_DIR ...]

One Markdown row per side of every bench step (device, versions, peak memory, seconds per step or the longest
completion that fits, ratio to TRL alone), with the command that produced it; a step that failed, timed out or was
skipped is a row that says so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HEADER = ("| device | stage / step | side | peak GB | s/step | longest fit | vs TRL alone | command |\n"
          "|---|---|---|---|---|---|---|---|")


def _versions(v: dict) -> str:
    return ", ".join(f"{k} {v[k]}" for k in ("torch", "transformers", "trl") if v.get(k))


def _side_row(device: str, where: str, side: str, r: dict, base: dict, cmd: str) -> str:
    if "skipped" in r:
        return f"| {device} | {where} | {side} | skipped: {r['skipped']} | | | | `{cmd}` |"
    peak = f"{r['peak_gb']:.2f}" if isinstance(r.get("peak_gb"), float) else ""
    step = f"{r['step_s'][-1]:.2f}" if r.get("step_s") else ""
    fit = str(r.get("longest_fit", "")) if "longest_fit" in r else ""
    ratio = ""
    if side != "trl" and base:
        if fit and base.get("longest_fit"):
            ratio = f"{r['longest_fit'] / base['longest_fit']:.2f}x length" if r.get("longest_fit") else ""
        elif r.get("peak_gb") and base.get("peak_gb") and r.get("step_s") and base.get("step_s"):
            ratio = (f"{r['peak_gb'] / base['peak_gb']:.2f}x memory, "
                     f"{r['step_s'][-1] / base['step_s'][-1]:.2f}x time")
    return f"| {device} | {where} | {side} | {peak} | {step} | {fit} | {ratio} | `{cmd}` |"


def rows(report: dict) -> list[str]:
    """The rows of one stage's JSON."""
    v = report.get("versions", {})
    device = f"{v.get('device', '?')} ({_versions(v)})"
    out = []
    for step in report.get("steps", []):
        where = f"{report['stage']} / {step['name']}"
        if "skipped" in step:
            out.append(f"| {device} | {where} | | not run: {step['skipped']} | | | | |")
            continue
        result = step.get("result")
        if step.get("rc") == 0 and result is None:
            continue  # a step without figures (doctor, the CUDA tests) that passed: nothing to report
        if step.get("timed_out") or step.get("rc") != 0 or not isinstance(result, dict):
            state = "timed out" if step.get("timed_out") else f"exit {step.get('rc')}"
            out.append(f"| {device} | {where} | | {state}, no result | | | | `{step['cmd']}` |")
            continue
        sides = {k: r for k, r in result.items() if isinstance(r, dict) and "side" in r}
        if not sides:  # the kernel comparison: one row, its decision per pass is in the JSON
            out.append(f"| {device} | {where} | (per pass) | | | | see JSON | `{step['cmd']}` |")
            continue
        for side, r in sides.items():
            out.append(_side_row(device, where, side, r, sides.get("trl", {}), step["cmd"]))
    return out


def main(argv: list[str] | None = None) -> int:
    dirs = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not dirs:
        raise SystemExit("usage: python bench/gpu_report.py RESULTS_DIR [RESULTS_DIR ...]")
    print(HEADER)
    for d in dirs:
        for path in sorted(d.glob("*.json")):
            for row in rows(json.loads(path.read_text())):
                print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
