"""What a user of ``slimrl train`` looks at: per-step metrics files, a PNG plot, the final summary table."""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from slimrl.health.checks import reward_keys, reward_name

NO_PLOT = "not drawn: matplotlib not installed (pip install 'slimrl[cli]')"
# Columns written to metrics.csv (metrics.jsonl keeps every key TRL logs).
CSV_COLUMNS = (
    "step",
    "loss",
    "reward",
    "reward_std",
    "kl",
    "entropy",
    "completions/mean_length",
    "tools/call_frequency",
    "tools/failure_frequency",
    "rewards/margins",
    "rewards/accuracies",
    "memory/peak_mb",
    "tokens_per_s",
    "step_time",
    "learning_rate",
    "grad_norm",
    "frac_reward_zero_std",
    "completions/clipped_ratio",
    "sampling/kl_k3/mean",
    "sampling/is_masked_share/sequence",
)
PLOTTED = (
    ("reward", "reward"),
    ("kl", "KL"),
    ("completions/mean_length", "completion length (tokens)"),
    ("memory/peak_mb", "peak memory (MB)"),
    ("frac_reward_zero_std", "groups without reward spread (no signal)"),
    ("entropy", "entropy (nats per token)"),
    ("completions/clipped_ratio", "completions truncated"),
)
# Tool-loop runs (TRL logs these when the trainer has tools): their panels, added when logged.
TOOL_PANELS = (
    ("tools/call_frequency", "tool calls per completion"),
    ("tools/failure_frequency", "failed tool calls (share of calls)"),
)
# A generator other than the trained model (vLLM, slimrl's engine, a server): its disagreement with the trainer.
SAMPLER_PANELS = (
    ("sampling/kl_k3/mean", "sampler-trainer KL (k3, nats per token)"),
    ("sampling/is_masked_share/sequence", "sequences masked by the IS correction"),
)
# Panels with a moving average drawn over the per-step points (noisy per step: the trend is what a user reads).
SMOOTHED = ("reward",)
# Offline (preference / SFT) trainers log no reward: their panels.
PLOTTED_OFFLINE = (
    ("loss", "loss"),
    ("rewards/margins", "reward margin (chosen - rejected)"),
    ("rewards/accuracies", "preference accuracy"),
    ("grad_norm", "gradient norm"),
)


class MetricsFileCallback(TrainerCallback):
    """Appends every training log row to ``metrics.jsonl`` and ``metrics.csv`` in ``out_dir`` (resume-safe:
    rows at or after the resumed step are replaced, not duplicated)."""

    def __init__(self, out_dir: str | Path) -> None:
        self.out = Path(out_dir)
        self.jsonl = self.out / "metrics.jsonl"
        self.csv = self.out / "metrics.csv"

    def on_train_begin(self, args, state, control, **kwargs):
        self.out.mkdir(parents=True, exist_ok=True)
        rows = [r for r in read_metrics(self.jsonl) if r.get("step", 0) <= state.global_step]
        self._rewrite(rows)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or not state.is_world_process_zero:
            return
        row = {"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, int | float)}}
        with self.jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")
        with self.csv.open("a", newline="") as f:
            csv.writer(f).writerow([row.get(c, "") for c in CSV_COLUMNS])

    def _rewrite(self, rows: list[dict]) -> None:
        with self.jsonl.open("w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        with self.csv.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(CSV_COLUMNS)
            for r in rows:
                w.writerow([r.get(c, "") for c in CSV_COLUMNS])


# (log key, label, format) of the compact line `slimrl train` prints per step, in this order, when logged.
STEP_LINE = (
    ("loss", "loss", "{:.4f}"),
    ("reward", "reward", "{:.3f}"),
    ("kl", "kl", "{:.4f}"),
    ("completions/mean_length", "len", "{:.1f}"),
    ("tools/call_frequency", "calls", "{:.2f}"),
    ("tools/failure_frequency", "failed", "{:.2f}"),
    ("rewards/margins", "margin", "{:.3f}"),
    ("rewards/accuracies", "acc", "{:.2f}"),
    ("grad_norm", "grad", "{:.3f}"),
)


class StepLineCallback(TrainerCallback):
    """One compact line per logged step instead of TRL's raw dictionary (which stays in ``metrics.jsonl`` and
    ``report_to``): ``step 3/30  loss 0.0123  reward 0.812  kl 0.0012  len 18.4  2.4 s  1732 MB``. Step seconds
    are wall time since the previous logged step, per step; MB is ``memory/peak_mb`` where the trainer logs it."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stdout
        self._last: tuple[float, int] | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._last = (time.perf_counter(), state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or not state.is_world_process_zero:
            return
        now = time.perf_counter()
        then, step = self._last or (now, state.global_step - 1)
        self._last = (now, state.global_step)
        per_step = (now - then) / max(1, state.global_step - step)
        parts = [f"step {state.global_step}/{state.max_steps}"]
        parts += [
            f"{label} {fmt.format(logs[key])}"
            for key, label, fmt in STEP_LINE
            if isinstance(logs.get(key), int | float)
        ]
        if isinstance(logs.get("frac_reward_zero_std"), int | float):  # groups whose rewards differ: they teach
            parts.append(f"signal {1 - logs['frac_reward_zero_std']:.0%}")
        if logs.get("sampling/kl_k3/mean"):  # a separate generator that disagrees with the trainer
            parts.append(f"sampler kl {logs['sampling/kl_k3/mean']:.2g}")
        if logs.get("sampling/is_masked_share/sequence"):
            parts.append(f"is-masked {logs['sampling/is_masked_share/sequence']:.0%}")
        parts.append(f"{per_step:.1f} s")
        if isinstance(logs.get("memory/peak_mb"), int | float):
            parts.append(f"{logs['memory/peak_mb']:.0f} MB")
        print("  ".join(parts), file=self.stream, flush=True)


def use_step_lines(trainer) -> None:
    """Replace the Trainer's log printers (the tqdm bar's dict writer, ``PrinterCallback``) by
    :class:`StepLineCallback`."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(StepLineCallback())


def moving_average(values: list[float], window: int = 5) -> list[float]:
    """Trailing mean over up to ``window`` values (the first points average what exists so far)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def read_metrics(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def reward_panels(rows: list[dict]) -> tuple[tuple[str, str], ...]:
    """One panel per reward function the run logged (``rewards/<fn>/mean``), in order of appearance."""
    return tuple((k, f"reward: {reward_name(k)}") for k in reward_keys(rows))


def plot_metrics(rows: list[dict], path: str | Path, panels: tuple = PLOTTED) -> Path | None:
    """One panel per ``(key, title)`` of ``panels`` (default: reward, KL, completion length, peak memory, the groups
    without reward spread, entropy, the truncated completions) and, for an online run, one per reward function,
    per step, as a PNG; rewards get a 5-step moving average. None without matplotlib or rows."""
    if not rows:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if panels is PLOTTED:
        panels = (
            panels
            + reward_panels(rows)
            + tuple((k, title) for k, title in TOOL_PANELS + SAMPLER_PANELS if any(k in r for r in rows))
        )
    cols = 2 if len(panels) <= 4 else 3
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.25 * nrows), squeeze=False)
    for ax, (key, title) in zip(axes.flat, panels):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float) and math.isfinite(r[key])]
        if pts:
            ax.plot(*zip(*pts), marker="o", markersize=3, label=key)
            if (key in SMOOTHED or key.startswith("rewards/")) and len(pts) > 1:
                steps, values = zip(*pts)
                ax.plot(steps, moving_average(list(values)), linewidth=2, label="moving average (5 steps)")
                ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def mean_of(rows: list[dict], key: str, first: bool, n: int = 5) -> float | None:
    vals = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    if not vals:
        return None
    part = vals[:n] if first else vals[-n:]
    return sum(part) / len(part)


def summary_table(items: list[tuple[str, Any]]) -> str:
    width = max(len(k) for k, _ in items)
    line = "-" * (width + 48)
    body = "\n".join(f"{k.ljust(width)}  {v}" for k, v in items)
    return f"{line}\n{body}\n{line}"


def fmt_change(before: float | None, after: float | None, digits: int = 3) -> str:
    if before is None or after is None:
        return "n/a"
    return f"{before:.{digits}f} -> {after:.{digits}f} ({after - before:+.{digits}f})"


def plot_for(out: Path, online: bool) -> Path | None:
    """``metrics.png`` of the run in ``out`` (online: reward panels; offline: loss/preference panels)."""
    return plot_metrics(
        read_metrics(out / "metrics.jsonl"), out / "metrics.png", PLOTTED if online else PLOTTED_OFFLINE
    )


def print_summary(
    algorithm: str,
    steps: int,
    seconds: float,
    peak_mb: float,
    out: Path,
    plot: Path | None,
    before: dict | None,
    after: dict | None,
    eval_rows: int,
    resume_from: Path | None,
    health: dict[str, str] | None = None,
    warmed: dict | None = None,
    eval_how: str = "greedy",
) -> dict[str, Any]:
    """The summary table `slimrl train` prints at the end; returns the same facts as a dict. ``warmed``: the
    held-out scores after a warm start (printed between before and after); ``eval_how``: how the held-out
    completions were decoded."""
    rows = read_metrics(out / "metrics.jsonl")
    summary = {
        "steps": steps,
        "time_s": seconds,
        "peak_memory_mb": peak_mb,
        "algorithm": algorithm,
        "train_reward_start": mean_of(rows, "reward", first=True),
        "train_reward_end": mean_of(rows, "reward", first=False),
        "train_loss_start": mean_of(rows, "loss", first=True),
        "train_loss_end": mean_of(rows, "loss", first=False),
        "eval_decoding": eval_how,
        "eval_before": before,
        "eval_after_warm_start": warmed,
        "eval_after": after,
        "adapter": str(out / "adapter"),
        "metrics": str(out / "metrics.jsonl"),
        "plot": str(plot) if plot else None,
        "resumed_from": str(resume_from) if resume_from else None,
    }
    items = [
        ("algorithm", algorithm),
        ("steps", steps),
        ("time", f"{seconds:.0f} s"),
        ("peak memory", f"{peak_mb:.0f} MB"),
    ]
    if summary["train_reward_start"] is not None:
        items.append(
            (
                "train reward (first 5 -> last 5 steps)",
                fmt_change(summary["train_reward_start"], summary["train_reward_end"]),
            )
        )
    else:
        items.append(
            ("train loss (first 5 -> last 5 steps)", fmt_change(summary["train_loss_start"], summary["train_loss_end"]))
        )
    if before and after and warmed:
        items += [
            (
                f"held-out {name} ({eval_how}, {eval_rows} rows)",
                f"{before[name]:.3f} -> {warmed[name]:.3f} after warm start -> {after[name]:.3f}",
            )
            for name in before
        ]
    elif before and after:
        items += [
            (f"held-out {name} ({eval_how}, {eval_rows} rows)", fmt_change(before[name], after[name]))
            for name in before
            if name != "reward"
        ]
        items.append((f"held-out total reward ({eval_how})", fmt_change(before["reward"], after["reward"])))
    summary["health"] = health
    items += [
        ("adapter + tokenizer", out / "adapter"),
        ("checkpoints", f"{out}/checkpoint-*"),
        ("metrics", f"{out}/metrics.jsonl, metrics.csv"),
        ("plot", plot or NO_PLOT),
    ]
    if resume_from:
        items.append(("resumed from", resume_from))
    items.append(("export (merged model, GGUF)", f"slimrl export --adapter {out} --formats merged_16bit,gguf:q8_0"))
    if health:
        items += [(f"health: {name}", status) for name, status in health.items()]
    print("\nslimrl train: summary\n" + summary_table(items), flush=True)
    return summary
