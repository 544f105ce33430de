"""BENCHMARKS.md rows from the GPU runner's results (``bench/gpu_run.py``: ``A.json``, ``B.json``):

    python bench/gpu_report.py RESULTS_DIR [RESULTS_DIR ...]

One Markdown row per check and per side of every bench step (device, versions, peak memory allocated/reserved,
seconds per step or the longest completion that fits, ratios to TRL alone and to Unsloth on the same config, and
``slimrl plan``'s prediction beside slimrl's figures), each with the command that produced it; a step that failed,
timed out or was skipped is a row that says so. Then the issue's targets, each marked met or not (or not measured).
Sides of one config are compared across the two commands (Unsloth's headline runs in B, TRL's in A), only when the
device is the same."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HEADER = (
    "| device | step | side | peak GB alloc / reserved | s/step | longest fit | vs TRL alone | vs Unsloth | "
    "slimrl plan | command |\n|---|---|---|---|---|---|---|---|---|---|"
)
CHECKS = (
    "doctor",
    "parity-grpo",
    "parity-dpo",
    "parity-dpo-chunked",
    "parity-4bit",
    "prefix-attention",
    "unsloth-setup",
)


def _versions(v: dict) -> str:
    return ", ".join(f"{k} {v[k]}" for k in ("torch", "transformers", "trl") if v.get(k))


def _key(result: dict) -> tuple:
    c = result.get("config", {})
    what = ("fit", c.get("cap_gb")) if c.get("length") is None else ("step", c.get("length"))
    # gpu_compare.py's config names no quantization: it runs the bf16 base, as gpu_grpo.py's "bf16"
    return (c.get("shape"), c.get("quant") or "bf16", c.get("prompt_length"), c.get("generations"), *what)


def collect(reports: list[dict]) -> dict[tuple, dict[str, dict]]:
    """{(device, config key): {side: figures}} over every bench step of every stage."""
    table: dict[tuple, dict[str, dict]] = {}
    for report in reports:
        device = report.get("versions", {}).get("device", "?")
        for step in report.get("steps", []):
            result = step.get("result")
            if isinstance(result, dict) and "config" in result:
                sides = {k: r for k, r in result.items() if isinstance(r, dict) and "side" in r}
                table.setdefault((device, _key(result)), {}).update(sides)
    return table


def _ratio(r: dict, base: dict | None, fit: bool) -> str:
    if not base or base is r:
        return ""
    if fit:
        return (
            f"{r['longest_fit'] / base['longest_fit']:.2f}x length"
            if r.get("longest_fit") and base.get("longest_fit")
            else ""
        )
    if r.get("peak_gb") and base.get("peak_gb") and r.get("step_s") and base.get("step_s"):
        return f"{r['peak_gb'] / base['peak_gb']:.2f}x memory, {r['step_s'][-1] / base['step_s'][-1]:.2f}x time"
    return ""


def _plan(plan: dict | None, side: str, fit: bool) -> str:
    if not plan or not side.startswith("slimrl"):
        return ""
    if "error" in plan:
        return f"no prediction ({plan['error'][:60]})"
    return f"longest {plan.get('longest_fit')}" if fit else f"{plan['peak_gb']:.2f} GB, {plan['step_s']:.2f} s"


def _side_row(device: str, where: str, side: str, r: dict, group: dict, plan: dict | None, cmd: str, fit: bool) -> str:
    if "skipped" in r or "failed" in r:
        return (
            f"| {device} | {where} | {side} | {'skipped' if 'skipped' in r else 'failed'}: "
            f"{r.get('skipped') or r.get('failed')} | | | | | | `{cmd}` |"
        )
    if "oom" in r:
        return f"| {device} | {where} | {side} | out of memory | | | | | {_plan(plan, side, fit)} | `{cmd}` |"
    peak = f"{r['peak_gb']:.2f} / {r['reserved_gb']:.2f}" if isinstance(r.get("peak_gb"), float) else ""
    step = f"{r['step_s'][-1]:.2f}" if r.get("step_s") else ""
    longest = str(r.get("longest_fit")) + ("" if r.get("confirmed", True) else " (probe failed)") if fit else ""
    return (
        f"| {device} | {where} | {side} | {peak} | {step} | {longest} | {_ratio(r, group.get('trl'), fit)} | "
        f"{_ratio(r, group.get('unsloth'), fit)} | {_plan(plan, side, fit)} | `{cmd}` |"
    )


def rows(report: dict, table: dict[tuple, dict[str, dict]] | None = None) -> list[str]:
    """The rows of one stage's JSON; ``table`` (from :func:`collect`) supplies the other stage's sides."""
    table = table if table is not None else collect([report])
    v = report.get("versions", {})
    device = f"{v.get('device', '?')} ({_versions(v)})"
    out = []
    for step in report.get("steps", []):
        where = f"{report['stage']} / {step['name']}"
        if "skipped" in step:
            out.append(f"| {device} | {where} | | not run: {step['skipped']} | | | | | | |")
            continue
        result = step.get("result")
        if step.get("timed_out") or step.get("rc") != 0:
            state = "timed out" if step.get("timed_out") else f"exit {step.get('rc')}"
            out.append(
                f"| {device} | {where} | | {state}{'' if result else ', no result'} | | | | | | `{step['cmd']}` |"
            )
        if step["name"] in CHECKS:
            if step.get("rc") == 0:
                out.append(f"| {device} | {where} | | passed in {step['seconds']} s | | | | | | `{step['cmd']}` |")
            continue
        if not isinstance(result, dict) or "config" not in result:
            continue
        group = table.get((v.get("device", "?"), _key(result)), {})
        fit = result["config"].get("length") is None
        for side, r in result.items():
            if isinstance(r, dict) and "side" in r:
                out.append(_side_row(device, where, side, r, group, result.get("plan"), step["cmd"], fit))
    return out


def _last_step(r: dict) -> float | None:
    return (r.get("step_s") or [None])[-1]


def targets(reports: list[dict]) -> list[str]:
    """The issue's targets against the measured rows: met, not met, or not measured."""
    table, lines = collect(reports), []

    def mark(label: str, value: float | None, limit: float, at_most: bool) -> None:
        if value is None:
            lines.append(f"- {label}: not measured")
        else:
            ok = value <= limit if at_most else value >= limit
            lines.append(
                f"- {label}: {value:.2f}x ({'met' if ok else 'NOT met'}, target {'<=' if at_most else '>='} {limit}x)"
            )

    def ratio(group: dict, side: str, base: str, key) -> float | None:
        a, b = group.get(side, {}), group.get(base, {})
        x, y = key(a), key(b)
        return x / y if x and y else None

    for (device, key), group in sorted(table.items(), key=str):
        name = f"{device}, {key[0]} {key[1]}, " + (
            f"fit under {key[5]} GB" if key[4] == "fit" else f"{key[3]} x {key[5]}"
        )
        if key[4] == "fit":
            for base, limit in (("trl", 2.0), ("trl-liger", 1.3), ("unsloth", 1.2)):
                mark(
                    f"{name}: slimrl's longest vs {base}",
                    ratio(group, "slimrl", base, lambda r: r.get("longest_fit")),
                    limit,
                    False,
                )
        elif key[1] == "qlora":
            fits = {
                s: (
                    "out of memory"
                    if "oom" in r
                    else "skipped"
                    if "skipped" in r
                    else "failed"
                    if "failed" in r
                    else f"{r['peak_gb']:.2f} GB"
                )
                for s, r in group.items()
            }
            peaks = {s: r["peak_gb"] for s, r in group.items() if isinstance(r.get("peak_gb"), float)}
            lowest = min(peaks, key=peaks.get) if peaks else None
            lines.append(
                f"- {name}: {fits}; lowest peak: {lowest} "
                f"({'met' if lowest == 'slimrl' else 'NOT met' if lowest else 'not measured'})"
            )
        else:
            for base, mem, secs in (("trl", 0.6, 1.0), ("unsloth", 0.9, 1.0)):
                mark(
                    f"{name}: slimrl peak vs {base}",
                    ratio(group, "slimrl", base, lambda r: r.get("peak_gb")),
                    mem,
                    True,
                )
                mark(f"{name}: slimrl step time vs {base}", ratio(group, "slimrl", base, _last_step), secs, True)
    checks = [s for r in reports for s in r.get("steps", []) if s.get("name", "").startswith(("parity", "prefix"))]
    if checks:
        passed = all(s.get("rc") == 0 for s in checks)
        lines.append(
            f"- CUDA correctness ({', '.join(s['name'] for s in checks)}): "
            f"{'every check passed (met)' if passed else 'NOT met'}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    dirs = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not dirs:
        raise SystemExit("usage: python bench/gpu_report.py RESULTS_DIR [RESULTS_DIR ...]")
    reports = [json.loads(p.read_text()) for d in dirs for p in sorted(d.glob("*.json"))]
    table = collect(reports)
    print(HEADER)
    for report in reports:
        for row in rows(report, table):
            print(row)
    print("\nTargets:")
    print("\n".join(targets(reports)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
