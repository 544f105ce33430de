"""What a user of ``slimrl train`` looks at: per-step metrics files, a PNG plot, the final summary table."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

# Columns written to metrics.csv (metrics.jsonl keeps every key TRL logs).
CSV_COLUMNS = ("step", "loss", "reward", "reward_std", "kl", "entropy", "completions/mean_length",
               "rewards/margins", "rewards/accuracies", "memory/peak_mb", "tokens_per_s", "step_time",
               "learning_rate", "grad_norm")
PLOTTED = (("reward", "reward"), ("kl", "KL"), ("completions/mean_length", "completion length (tokens)"),
           ("memory/peak_mb", "peak memory (MB)"))
# Offline (preference / SFT) trainers log no reward: their panels.
PLOTTED_OFFLINE = (("loss", "loss"), ("rewards/margins", "reward margin (chosen - rejected)"),
                   ("rewards/accuracies", "preference accuracy"), ("grad_norm", "gradient norm"))


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


def read_metrics(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_metrics(rows: list[dict], path: str | Path, panels: tuple = PLOTTED) -> Path | None:
    """One panel per ``(key, title)`` of ``panels`` (default: reward, KL, completion length, peak memory) per
    step, as a PNG. None without matplotlib or rows."""
    if not rows:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5))
    for ax, (key, title) in zip(axes.flat, panels):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float) and math.isfinite(r[key])]
        if pts:
            ax.plot(*zip(*pts), marker="o", markersize=3)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
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
