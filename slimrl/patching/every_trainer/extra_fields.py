"""slimrl's extra config fields, each declared once: name, type, default, help text, the check of its value, the
trainers it acts on and why it does nothing elsewhere (:mod:`slimrl.patching.every_trainer.config_fields` adds them to
TRL's config dataclasses)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _num_chunks(name: str, value: Any) -> Any:
    if value is None:
        return -1
    if isinstance(value, bool) or not (_positive_int(value) or value == -1):
        raise ValueError(
            f"{name}={value!r} is invalid: use -1 (chosen from free memory) or an int >= 1 (number of "
            f"row chunks for the log-prob pass)"
        )
    return value


def _optional_positive_int(name: str, value: Any) -> Any:
    if value is not None and not _positive_int(value):
        raise ValueError(f"{name}={value!r} is invalid: use an int >= 1 or None")
    return value


def _window(name: str, value: Any) -> Any:
    if not _positive_int(value):
        raise ValueError(f"{name}={value!r} is invalid: use an int >= 1")
    return value


def _flag(name: str, value: Any) -> Any:
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is invalid: use true or false")
    return value


def _number(name: str, value: Any, low: float, high: float | None, what: str) -> float:
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value > low
        and (high is None or value <= high)
    )
    if not ok:
        raise ValueError(f"{name}={value!r} is invalid: use {what}")
    return float(value)


def _fraction(name: str, value: Any) -> float:
    return _number(name, value, 0.0, 1.0, "a fraction in (0, 1], e.g. 0.9")


def _positive(name: str, value: Any) -> float:
    return _number(name, value, 0.0, None, "a number > 0")


def _size(name: str, value: Any) -> Any:
    if value is not None:
        from slimrl.compat.memory import parse_bytes

        try:
            parse_bytes(value)
        except ValueError:
            raise ValueError(
                f"{name}={value!r} is invalid: write a size such as 12GB or 512MB, or None (free memory minus a margin)"
            ) from None
    return value


@dataclasses.dataclass(frozen=True)
class ExtraField:
    """One of slimrl's config fields, declared once."""

    name: str
    type: Any
    default: Any
    help: str  # the flag's help text (without the "slimrl: " prefix every field's help gets)
    check: Callable[[str, Any], Any]  # (name, value) -> the value, normalised; ValueError naming the fix
    # the capability it needs: "log-probs" (a log-prob pass slimrl computes), "online" (also generation and rewards),
    # "grpo" (also vLLM's importance sampling); which trainers have it is their rows' `fields` (patching/table.py)
    acts_on: str
    no_effect: str  # why it does nothing on a trainer it does not act on (the refusal says this, naming its trainers)
    doc: str = ""  # the README table's "meaning" cell (default: the help text)


_CHUNKS = "this trainer has no vocabulary-sized log-prob pass that slimrl chunks"
FIELDS: tuple[ExtraField, ...] = (
    ExtraField(
        "unsloth_num_chunks",
        int,
        -1,
        "row chunks of the log-prob pass (-1: chosen from free memory).",
        _num_chunks,
        "log-probs",
        _CHUNKS,
    ),
    ExtraField(
        "unsloth_logit_chunk_multiplier",
        int | None,
        None,
        "divide the automatic log-prob chunk size by this (more, smaller logits blocks).",
        _optional_positive_int,
        "log-probs",
        _CHUNKS,
    ),
    ExtraField(
        "unsloth_grpo_mini_batch",
        int | None,
        None,
        "rows per no-grad log-prob forward; at most the generation batch.",
        _optional_positive_int,
        "online",
        "this trainer has no no-grad log-prob passes for it to split",
    ),
    ExtraField(
        "max_seq_length",
        int | None,
        None,
        "longest prompt + completion; unset = the model's max_seq_length (FastLanguageModel), never above it.",
        _optional_positive_int,
        "online",
        "this trainer has no prompt + completion budget for it to bound",
    ),
    ExtraField(
        "slimrl_reuse_old_logps",
        bool,
        True,
        "with vLLM's importance-sampling correction, take the old "
        "log-probs from the policy forward when the policy cannot have changed (skips a no-grad pass).",
        _flag,
        "grpo",
        "this trainer has no vLLM importance-sampling pass for it to skip",
    ),
    ExtraField(
        "slimrl_length_groups",
        bool,
        True,
        "log-prob forwards over rows grouped by completion length, trailing padding cut.",
        _flag,
        "grpo",
        "this trainer's log-prob forwards are not grouped by length",
    ),
    ExtraField(
        "slimrl_shared_prefix",
        bool,
        True,
        "log-prob forwards with each prompt once per group: the rows "
        "of a prompt packed as [prompt, c1, ..., cG], same log-probs and gradients (sdpa attention); HF "
        "generate's prefill once per distinct prompt.",
        _flag,
        "online",
        "this trainer does not repeat each prompt once per completion",
    ),
    ExtraField(
        "slimrl_token_budget",
        int | None,
        None,
        "tokens per log-prob forward when grouping by length (None: the trainer's own rows x padded length).",
        _optional_positive_int,
        "grpo",
        "this trainer's log-prob forwards are not grouped by length",
    ),
    ExtraField(
        "slimrl_oom_recovery",
        bool,
        True,
        "a log-prob pass or policy backward that runs out of memory is "
        "split in halves and retried (same loss), the smaller size kept.",
        _flag,
        "online",
        "this trainer's log-prob passes are not split on out-of-memory",
    ),
    ExtraField(
        "slimrl_auto_fit",
        bool,
        False,
        "before training, apply the fastest plan that fits the memory budget "
        "(checkpointing, no-grad mini-batch); see `slimrl plan`.",
        _flag,
        "online",
        "this trainer is not fitted to a memory budget",
    ),
    ExtraField(
        "slimrl_memory_budget",
        str | None,
        None,
        "memory budget for slimrl_auto_fit, e.g. 12GB (None: free memory minus a margin).",
        _size,
        "online",
        "this trainer is not fitted to a memory budget",
    ),
    ExtraField(
        "slimrl_longest_first",
        bool,
        False,
        "the first step generates the longest completions the run allows, so a run that cannot fit fails at step 1.",
        _flag,
        "online",
        "this trainer does not generate its completions",
    ),
)
_HEALTH = "this trainer does not log the rewards, groups and completions the run-health checks read"
FIELDS += (
    ExtraField(
        "slimrl_health",
        bool,
        True,
        "run-health checks on what the trainer logs: one warning per problem "
        "found (no learning signal, truncation, entropy collapse, KL or clip runaway, NaN, rewards that "
        "disagree) and a health/<check> metric each.",
        _flag,
        "online",
        _HEALTH,
    ),
    ExtraField(
        "slimrl_health_window", int, 5, "logged steps each run-health check averages over.", _window, "online", _HEALTH
    ),
    ExtraField(
        "slimrl_health_zero_std",
        float,
        0.9,
        "warn when this fraction of groups has no reward spread (frac_reward_zero_std).",
        _fraction,
        "online",
        _HEALTH,
    ),
    ExtraField(
        "slimrl_health_min_groups",
        int,
        32,
        "prompt groups the no-signal check averages over at least (its window widens to cover them).",
        _window,
        "online",
        _HEALTH,
    ),
    ExtraField(
        "slimrl_health_truncated",
        float,
        0.8,
        "warn when this fraction of completions is cut at max_completion_length (completions/clipped_ratio).",
        _fraction,
        "online",
        _HEALTH,
    ),
    ExtraField(
        "slimrl_health_entropy_drop",
        float,
        0.05,
        "warn when entropy falls below this fraction of its first-window mean.",
        _fraction,
        "online",
        _HEALTH,
    ),
    ExtraField(
        "slimrl_health_kl_max",
        float,
        1.0,
        "warn when the KL to the reference (nats per token) averages this or more.",
        _positive,
        "online",
        _HEALTH,
    ),
    ExtraField(
        "slimrl_health_clip_max",
        float,
        0.3,
        "warn when this fraction of tokens is clipped (clip_ratio/region_mean).",
        _fraction,
        "online",
        _HEALTH,
    ),
    ExtraField(
        "slimrl_health_reward_z",
        float,
        2.0,
        "standard errors by which one reward must rise and another fall for the reward-conflict warning.",
        _positive,
        "online",
        _HEALTH,
    ),
)
_SAMPLER = "this trainer does not correct a separate generator's samples with importance sampling"
FIELDS += (
    ExtraField(
        "slimrl_health_mismatch_kl",
        float,
        0.005,
        "warn when the generator's KL to the trained model "
        "(k3, nats per token, sampling/kl_k3/mean) averages this or more.",
        _positive,
        "grpo",
        _SAMPLER,
    ),
    ExtraField(
        "slimrl_health_mismatch_masked",
        float,
        0.1,
        "warn when this share of sequences is masked or "
        "clamped by vLLM's importance-sampling correction (sampling/is_masked_share/sequence).",
        _fraction,
        "grpo",
        _SAMPLER,
    ),
    ExtraField(
        "slimrl_health_mismatch_ratio",
        float,
        0.2,
        "warn when the mean importance ratio before masking "
        "(sampling/raw_importance_sampling_ratio/mean) is below 1 - this or above 1 / (1 - this).",
        _fraction,
        "grpo",
        _SAMPLER,
    ),
    ExtraField(
        "slimrl_truncated_sampling_fix",
        bool,
        False,
        "TRL 1.17's handling of top_p/top_k/min_p in vLLM's "
        "importance-sampling ratio on older TRL: the sampler's log-probs put on the trainer's support "
        "(one extra no-grad forward per generation batch when sampling truncates).",
        _flag,
        "grpo",
        _SAMPLER,
    ),
)
EXTRA_FIELDS: dict[str, ExtraField] = {f.name: f for f in FIELDS}
_SCOPES = {"log-probs": ("log-probs",), "online": ("log-probs", "online"), "grpo": ("log-probs", "online", "grpo")}
CHUNK_FIELDS = tuple(f.name for f in FIELDS if f.acts_on in _SCOPES["log-probs"])  # every log-prob route
ONLINE_FIELDS = tuple(f.name for f in FIELDS if f.acts_on in _SCOPES["online"])  # generating, reward-driven
ALL_FIELDS = tuple(f.name for f in FIELDS if f.acts_on in _SCOPES["grpo"])  # and with vLLM's IS correction

# The one typed record of those fields: every read in the library goes through fields_of (a default stated once)
Fields = dataclasses.make_dataclass(
    "Fields", [(f.name, f.type, dataclasses.field(default=f.default)) for f in FIELDS], frozen=True
)
Fields.__doc__ = "slimrl's config fields of one config, typed (``fields_of``); a field's default where it has none."


def fields_of(args: Any) -> Any:
    """The :class:`Fields` of a TRL config (or any object with those attributes; None: every default): each value
    through its field's check (normalised, e.g. ``unsloth_num_chunks=None`` is -1; a bad one set after the config
    was built is the check's one-line ``ValueError``)."""
    values = {}
    for f in FIELDS:
        value = getattr(args, f.name, f.default) if args is not None else f.default
        values[f.name] = f.check(f.name, value) if value is not f.default else value
    return Fields(**values)
