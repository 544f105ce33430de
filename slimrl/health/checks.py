"""The run-health checks: pure functions of the log rows TRL's GRPO/RLOO already write, no extra compute.

Each check reads a history of logged training steps (one dict per logged step, TRL's keys: ``reward``,
``rewards/<fn>/mean``, ``frac_reward_zero_std``, ``completions/clipped_ratio``, ``entropy``, ``kl``,
``clip_ratio/region_mean``, ``loss``) and answers, at the newest row, one of:

* ``None``: it cannot judge yet (too few rows, or the metric is not logged by this run, e.g. ``kl`` with beta = 0);
* ``(False, "")``: healthy;
* ``(True, message)``: the condition holds; ``message`` is one line naming the cause and the usual fix.

"Window" is the last ``window`` logged rows (``logging_steps`` apart). The thresholds are config fields
(:class:`Thresholds`, read from ``slimrl_health_*``):

=================  ===========================================================================================
check              holds when
=================  ===========================================================================================
``no_signal``      the mean of ``frac_reward_zero_std`` >= ``zero_std`` over the window, widened to cover at least
                   ``min_groups`` groups (a fraction of 10 groups moves in steps of 0.1: too coarse to call a run
                   dead); groups whose completions all got the same reward have zero advantage: no gradient
``truncated``      the mean of ``completions/clipped_ratio`` over the window >= ``truncated``
``entropy``        the mean entropy over the window < ``entropy_drop`` x its mean over the first window
                   (needs two windows of rows)
``kl``             the mean ``kl`` over the window >= ``kl_max`` nats per token
``clip``           the mean ``clip_ratio/region_mean`` (``cispo_clip_ratio`` for CISPO) over the window >= ``clip_max``
``not_finite``     the newest ``loss`` is NaN/inf, or a reward function gave no finite reward (TRL logs None) on
                   every row of the window
``sampler_mismatch`` the generator's KL to the trainer or the share of sequences the vLLM importance-sampling
                   correction masks passes its limit (:mod:`slimrl.health.sampler`, which names the cause)
``reward_conflict`` one reward function's window mean rose and another's fell, each by more than ``reward_z``
                   standard errors against the window before, while the two were positively correlated over the
                   rows before the window (needs three windows of rows)
=================  ===========================================================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slimrl.health.sampler import SamplerFacts, sampler_mismatch

Row = dict[str, Any]
Verdict = tuple[bool, str] | None


@dataclass(frozen=True)
class Thresholds:
    """The checks' limits (config fields ``slimrl_health_*``)."""

    window: int = 5
    zero_std: float = 0.9
    min_groups: int = 32
    truncated: float = 0.8
    entropy_drop: float = 0.05
    kl_max: float = 1.0
    clip_max: float = 0.3
    reward_z: float = 2.0
    mismatch_kl: float = 0.005
    mismatch_masked: float = 0.1
    mismatch_ratio: float = 0.2
    sampler: SamplerFacts | None = None  # the generator's settings, for the sampler check's causes
    max_completion_length: int | None = None  # named in the truncation message
    groups_per_row: float = 1.0  # prompt groups behind one logged row (no_signal's window in rows)

    @classmethod
    def from_args(cls, args: Any, limits: dict[str, Any], fix: bool = False) -> Thresholds:
        """The thresholds of a run: ``limits`` (:data:`LIMITS` -> value: the config's ``slimrl_health_<name>``,
        read by the caller through slimrl's typed config fields; a limit not given keeps the default above, which
        equals the field's), the rest from TRL's own config fields."""
        return cls(
            **limits,
            max_completion_length=getattr(args, "max_completion_length", None),
            groups_per_row=groups_per_row(args),
            sampler=SamplerFacts.from_args(args, fix),
        )


LIMITS = (
    "window",
    "zero_std",
    "min_groups",
    "truncated",
    "entropy_drop",
    "kl_max",
    "clip_max",
    "reward_z",
    "mismatch_kl",
    "mismatch_masked",
    "mismatch_ratio",
)  # each the config field slimrl_health_<name>


def groups_per_row(args: Any) -> float:
    """Prompt groups one logged row of GRPO/RLOO averages over: the optimizer step's global batch
    (``per_device_train_batch_size`` x ``gradient_accumulation_steps`` x processes) / ``num_generations``, times
    ``logging_steps``."""
    try:
        rows = args.per_device_train_batch_size * args.gradient_accumulation_steps * getattr(args, "world_size", 1)
        return max(rows / args.num_generations, 1e-9) * max(int(args.logging_steps), 1)
    except (AttributeError, TypeError, ZeroDivisionError):
        return 1.0


def finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def series(rows: Sequence[Row], key: str) -> list[float]:
    """The finite values of ``key`` in ``rows``, in order (rows without it skipped)."""
    return [float(r[key]) for r in rows if finite(r.get(key))]


def reward_keys(rows: Sequence[Row]) -> list[str]:
    """The ``rewards/<fn>/mean`` keys TRL logged in ``rows`` (one per reward function), in order of appearance."""
    return list(dict.fromkeys(k for r in rows for k in r if k.startswith("rewards/") and k.endswith("/mean")))


def reward_name(key: str) -> str:
    """``rewards/<fn>/mean`` -> ``<fn>``."""
    return key[len("rewards/") : -len("/mean")]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _window_mean(rows: Sequence[Row], key: str, window: int) -> float | None:
    """Mean of ``key`` over the last ``window`` rows, when each of them logged it finitely."""
    last = rows[-window:]
    if len(last) < window or not all(finite(r.get(key)) for r in last):
        return None
    return mean([float(r[key]) for r in last])


def _at_least(rows: Sequence[Row], key: str, window: int, limit: float, say: Callable[[float], str]) -> Verdict:
    """Whether ``key``'s mean over the last ``window`` rows is ``limit`` or more; ``say(mean)`` is the message."""
    m = _window_mean(rows, key, window)
    return None if m is None else (m >= limit, say(m))


def _steps(rows: Sequence[Row], window: int) -> str:
    last = rows[-window:]
    return f"steps {last[0].get('step', '?')}-{last[-1].get('step', '?')}"


def no_signal(rows: Sequence[Row], t: Thresholds) -> Verdict:
    window = max(t.window, math.ceil(t.min_groups / t.groups_per_row))
    return _at_least(
        rows,
        "frac_reward_zero_std",
        window,
        t.zero_std,
        lambda m: (
            f"no learning signal: in {m:.0%} of groups every completion got the same reward "
            f"({_steps(rows, window)}, frac_reward_zero_std), so their advantages are 0 and they teach nothing; the "
            f"rewards are too easy or too hard for this model: give partial credit, choose prompts of matching "
            f"difficulty, or raise num_generations or temperature"
        ),
    )


def truncated(rows: Sequence[Row], t: Thresholds) -> Verdict:
    limit = f"max_completion_length={t.max_completion_length}" if t.max_completion_length else "max_completion_length"
    return _at_least(
        rows,
        "completions/clipped_ratio",
        t.window,
        t.truncated,
        lambda m: (
            f"completions truncated: {m:.0%} of completions were cut off at {limit} ({_steps(rows, t.window)}, "
            f"completions/clipped_ratio), so the rewards judge unfinished text; raise max_completion_length, or reward "
            f"answers that finish (a closing tag or format) within it"
        ),
    )


def entropy(rows: Sequence[Row], t: Thresholds) -> Verdict:
    values = series(rows, "entropy")
    if len(values) < 2 * t.window:
        return None
    first, last = mean(values[: t.window]), mean(values[-t.window :])
    return first > 0 and last < t.entropy_drop * first, (
        f"entropy collapsed: mean per-token entropy fell from {first:.3g} (first {t.window} logged steps) to "
        f"{last:.3g} ({_steps(rows, t.window)}): the policy samples almost deterministically and a group's "
        f"completions stop differing; lower the learning rate, raise temperature, or add an entropy bonus "
        f"(entropy_coef) or a KL penalty (beta)"
    )


def kl(rows: Sequence[Row], t: Thresholds) -> Verdict:
    return _at_least(
        rows,
        "kl",
        t.window,
        t.kl_max,
        lambda m: (
            f"KL runaway: the KL to the reference model averaged {m:.3g} nats per token ({_steps(rows, t.window)}, "
            f"kl; limit slimrl_health_kl_max={t.kl_max:g}): the policy is moving far from where it started; lower "
            f"the learning rate, raise beta, and check that no reward can be gamed"
        ),
    )


def clip(rows: Sequence[Row], t: Thresholds) -> Verdict:
    key = (
        "clip_ratio/region_mean"
        if any(finite(r.get("clip_ratio/region_mean")) for r in rows[-t.window :])
        else "cispo_clip_ratio"
    )
    return _at_least(
        rows,
        key,
        t.window,
        t.clip_max,
        lambda m: (
            f"clip ratio runaway: {m:.0%} of completion tokens fell outside the trust region "
            f"({_steps(rows, t.window)}, {key}; limit slimrl_health_clip_max={t.clip_max:g}): each update moves the "
            f"policy too far from the one that generated; lower the learning rate or num_iterations"
        ),
    )


def not_finite(rows: Sequence[Row], t: Thresholds) -> Verdict:
    if not rows:
        return None
    newest = rows[-1]
    if "loss" in newest and not finite(newest["loss"]):
        return True, (
            f"loss is {newest['loss']} at step {newest.get('step', '?')}: lower the learning rate, train "
            f"in bf16 or fp32 instead of fp16, and bound the rewards"
        )
    last = rows[-t.window :]
    if len(last) < t.window:
        return False, ""
    dead = [k for k in sorted(reward_keys(last)) if all(k in r and not finite(r[k]) for r in last)]
    if dead:
        fn = reward_name(dead[0])
        return True, (
            f"reward function {fn!r} gave no finite reward to any completion ({_steps(rows, t.window)}, "
            f"{dead[0]} is NaN): make it return a float for every completion (None only where it does "
            f"not apply)"
        )
    return False, ""


def _corr(a: Sequence[float], b: Sequence[float]) -> float:
    ma, mb = mean(a), mean(b)
    sa = math.sqrt(sum((x - ma) ** 2 for x in a))
    sb = math.sqrt(sum((y - mb) ** 2 for y in b))
    if sa == 0 or sb == 0:
        return 0.0
    return sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (sa * sb)


def _shift(values: Sequence[float], window: int) -> tuple[float, float, float]:
    """(mean of the window before, mean of the last window, standard error of their difference)."""
    prev, last = values[-2 * window : -window], values[-window:]

    def var(v: Sequence[float]) -> float:
        m = mean(v)
        return sum((x - m) ** 2 for x in v) / max(len(v) - 1, 1)

    return mean(prev), mean(last), math.sqrt(var(prev) / len(prev) + var(last) / len(last))


def reward_conflict(rows: Sequence[Row], t: Thresholds) -> Verdict:
    keys = sorted(reward_keys(rows))
    if len(keys) < 2:
        return None
    paired = [r for r in rows if all(finite(r.get(k)) for k in keys)]  # rows where every function scored
    w = t.window
    if len(paired) < 3 * w:
        return None
    values = {k: [float(r[k]) for r in paired] for k in keys}
    moves = {}
    for k, v in values.items():
        before, now, se = _shift(v, w)
        moves[k] = (before, now, now - before, se)
    for up in keys:
        for down in keys:
            if up == down:
                continue
            b_up, n_up, d_up, se_up = moves[up]
            b_dn, n_dn, d_dn, se_dn = moves[down]
            rose = d_up > 0 and d_up > t.reward_z * se_up
            fell = d_dn < 0 and -d_dn > t.reward_z * se_dn
            if rose and fell and _corr(values[up][:-w], values[down][:-w]) > 0:
                name_up, name_dn = reward_name(up), reward_name(down)
                return True, (
                    f"rewards disagree: {name_up!r} rose ({b_up:.3g} -> {n_up:.3g}) while {name_dn!r}, which moved "
                    f"with it before, fell ({b_dn:.3g} -> {n_dn:.3g}) ({_steps(paired, w)} vs the {w} before): "
                    f"the policy may be gaming {name_up!r} at the expense of {name_dn!r} (reward hacking); read "
                    f"completions where {name_up!r} is high, then tighten it or lower its reward_weights"
                )
    return False, ""


CHECKS: dict[str, Callable[[Sequence[Row], Thresholds], Verdict]] = {
    "no_signal": no_signal,
    "truncated": truncated,
    "entropy": entropy,
    "kl": kl,
    "clip": clip,
    "not_finite": not_finite,
    "reward_conflict": reward_conflict,
    "sampler_mismatch": sampler_mismatch,
}
