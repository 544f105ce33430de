"""The table ``slimrl verify`` prints, with the reasons for its tolerances under it."""

from __future__ import annotations

import math

from slimrl.verify.rows import GEN_REASON, GEN_REASON_VLLM, GEN_TOLERANCE, REASON, TOLERANCE, Row


def _fmt_tol(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.0e}"


def _fmt(x: float) -> str:
    return "n/a" if math.isnan(x) else "inf" if math.isinf(x) else f"{x:.1e}"


def format_table(rows: list[Row], setup_line: str = "") -> str:
    """The table ``slimrl verify`` prints, with the tolerance reasons under it."""
    head = (
        "trainer",
        "loss type",
        "loss rel.err",
        "grad rel.err",
        "update rel.err",
        "tolerance",
        "gen logp diff",
        "result",
    )
    body = [
        (
            r.trainer,
            r.loss_type,
            _fmt(r.loss_err),
            _fmt(r.grad_err),
            _fmt(r.update_err),
            _fmt_tol(r.tolerance) + ("" if math.isnan(r.update_tolerance) else f", update {r.update_tolerance:.0e}"),
            "-"
            if math.isnan(r.gen_err)
            else f"{_fmt(r.gen_err)} (<= {r.gen_tolerance:.0e})"
            + ("" if r.generator == "hf" else f" {r.generator}")
            + ("" if math.isnan(r.masked_share) else f", {r.masked_share:.0%} masked"),
            "PASS"
            if r.passed
            else f"SKIP ({r.skipped})"
            if r.skipped
            else "FAIL" + (f" ({r.problem})" if r.problem else ""),
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    reasons = {r.tolerance for r in rows}
    for dtype, tol in TOLERANCE.items():
        if tol in reasons:
            lines.append(f"tolerance {tol:.0e}: {REASON[dtype]}")
    if any(not math.isnan(r.update_tolerance) for r in rows):
        lines.append(
            "update (a row's own tolerance): its weights are stored in 16 bits and each step rounds them to "
            "the dtype's spacing s; gradients that differ by the tolerance t round element i differently "
            "with probability ~ t|u_i|/s_i, so the update is measured only to 3 sqrt(t sum |u_i| s_i) / "
            "||u|| (u: TRL's update)"
        )
    gen = {r.gen_tolerance for r in rows if not math.isnan(r.gen_err) and r.generator == "hf"}
    vllm = {r.gen_tolerance for r in rows if r.generator != "hf"}
    for tol in sorted(vllm):
        lines.append(
            f"gen logp diff, engine/server rows (patched run only: TRL alone cannot draw the same samples "
            f"there): {tol:.0e}: {GEN_REASON_VLLM}; 'masked': the share of sequences TRL's importance-"
            f"sampling correction (sequence_mask, cap 3) dropped, mean over the steps"
        )
    for dtype, tol in GEN_TOLERANCE.items():
        if tol in gen:
            lines.append(
                f"gen logp diff: largest |log p| difference of a sampled token between the generator and "
                f"the training model; {tol:.0e}: {GEN_REASON[dtype]}"
            )
    if setup_line:
        lines.insert(0, setup_line)
    return "\n".join(lines)
