"""Each run-health check on synthetic log histories: silent until it can judge, quiet on a healthy history, and
holding (with its one-line message) on the failure it names."""

from __future__ import annotations

import math

import pytest

from slimrl.health.checks import CHECKS, Thresholds, reward_conflict
from slimrl.health.monitor import HealthCallback

T = Thresholds(window=3, min_groups=1, max_completion_length=64)


def rows(**columns) -> list[dict]:
    n = len(next(iter(columns.values())))
    return [{"step": i + 1, "loss": 0.1, **{k.replace("__", "/"): v[i] for k, v in columns.items()}} for i in range(n)]


@pytest.mark.parametrize(
    "check, healthy, sick, words",
    [
        (
            "no_signal",
            rows(frac_reward_zero_std=[0.2, 0.3, 0.25]),
            rows(frac_reward_zero_std=[1.0, 0.9, 1.0]),
            "no learning signal",
        ),
        (
            "truncated",
            rows(completions__clipped_ratio=[0.1, 0.0, 0.2]),
            rows(completions__clipped_ratio=[1.0, 0.9, 0.8]),
            "max_completion_length=64",
        ),
        ("kl", rows(kl=[0.01, 0.02, 0.05]), rows(kl=[0.5, 2.0, 3.0]), "KL runaway"),
        (
            "clip",
            rows(clip_ratio__region_mean=[0.0, 0.05, 0.1]),
            rows(clip_ratio__region_mean=[0.4, 0.5, 0.3]),
            "trust region",
        ),
        (
            "entropy",
            rows(entropy=[1.0, 0.9, 1.1, 0.8, 0.9, 0.7]),
            rows(entropy=[1.0, 0.9, 1.1, 0.05, 0.04, 0.03]),
            "entropy collapsed",
        ),
    ],
)
def test_windowed_checks(check, healthy, sick, words):
    fn = CHECKS[check]
    assert fn(healthy[:-1] if check != "entropy" else healthy[:4], T) is None  # too few rows: not judged
    assert fn(healthy, T) == (False, fn(healthy, T)[1])
    holds, message = fn(sick, T)
    assert holds and words in message and "\n" not in message


def test_no_signal_waits_for_enough_groups():
    """Two groups per logged row: the 32 groups the default asks for take 16 rows, however small the window."""
    t = Thresholds(window=3, groups_per_row=2.0)
    dead = rows(frac_reward_zero_std=[1.0] * 16)
    assert CHECKS["no_signal"](dead[:15], t) is None
    holds, message = CHECKS["no_signal"](dead, t)
    assert holds and "(steps 1-16, frac_reward_zero_std)" in message


def test_groups_per_row_from_the_config():
    from types import SimpleNamespace

    from slimrl.health.checks import groups_per_row

    args = SimpleNamespace(
        per_device_train_batch_size=8, gradient_accumulation_steps=2, world_size=2, num_generations=4, logging_steps=3
    )
    assert groups_per_row(args) == 8 * 2 * 2 / 4 * 3


def test_the_demo_job_is_healthy():
    """The 30 logged steps of a real `make demo` run (slimrl train's defaults: 8 rows = 2 groups of 4 per step,
    max_completion_length 32; 2026-11-25, this CPU) replayed through the monitor with the default thresholds: the
    run learns (held-out total reward 0.453 -> 1.312) and no check fires."""
    import json
    from pathlib import Path

    history = [json.loads(line) for line in (Path(__file__).parent / "demo_metrics.jsonl").read_text().splitlines()]
    assert len(history) == 30
    t = Thresholds(max_completion_length=32, groups_per_row=2.0)
    cb = HealthCallback(t)
    for row in history:
        cb.history.append(row)
        cb.evaluate(t, row["step"], warn_now=False)
    report = cb.report()
    assert report.pop("sampler_mismatch").startswith("not judged (sampling/kl_k3/mean not logged")  # HF generate
    assert report == {name: "ok" for name in CHECKS if name != "sampler_mismatch"}, report


def test_a_metric_the_run_does_not_log_is_not_judged():
    history = rows(reward=[0.1, 0.2, 0.3])
    assert all(CHECKS[c](history, T) is None for c in ("no_signal", "truncated", "kl", "clip", "entropy"))


def test_not_finite_loss_holds_at_once_and_a_dead_reward_after_a_window():
    history = rows(**{"rewards__fmt__mean": [0.5, 0.5, 0.5]})
    assert CHECKS["not_finite"](history, T) == (False, "")
    history[-1]["loss"] = math.nan
    holds, message = CHECKS["not_finite"](history, T)
    assert holds and message.startswith("loss is nan at step 3")
    dead = rows(**{"rewards__fmt__mean": [0.5, 0.5, 0.5], "rewards__judge__mean": [None, None, None]})
    holds, message = CHECKS["not_finite"](dead, T)
    assert holds and "'judge' gave no finite reward" in message
    dead[0]["rewards/judge/mean"] = 0.3  # a function that scored some rows of the window is alive
    assert CHECKS["not_finite"](dead, T) == (False, "")


def test_reward_conflict_needs_a_past_agreement_and_a_significant_split():
    up_then_up = [0.1, 0.2, 0.3, 0.4, 0.5, 0.55, 0.8, 0.85, 0.9]
    up_then_down = [0.1, 0.2, 0.3, 0.4, 0.5, 0.55, 0.2, 0.15, 0.1]
    history = rows(rewards__fmt__mean=up_then_up, rewards__correct__mean=up_then_down)
    assert reward_conflict(history[:8], T) is None  # three windows needed
    holds, message = reward_conflict(history, T)
    assert holds and "'fmt' rose" in message and "'correct'" in message and "reward hacking" in message
    together = rows(rewards__fmt__mean=up_then_up, rewards__correct__mean=up_then_up)
    assert reward_conflict(together, T) == (False, "")
    opposed_before = rows(
        rewards__fmt__mean=up_then_up, rewards__correct__mean=[0.9, 0.8, 0.7, 0.6, 0.5, 0.55, 0.2, 0.15, 0.1]
    )
    assert reward_conflict(opposed_before, T) == (False, "")  # they never agreed: a trade-off, not a change
    noisy = rows(rewards__fmt__mean=up_then_up, rewards__correct__mean=[0.1, 0.2, 0.3, 0.4, 0.5, 0.55, 0.9, 0.1, 0.5])
    assert reward_conflict(noisy, T) == (False, "")  # the fall is within noise


def test_callback_warns_once_adds_metrics_and_reports(recwarn):
    from transformers import TrainerControl, TrainerState

    from slimrl.health import RunHealthWarning

    cb, state = HealthCallback(T), TrainerState()
    state.is_world_process_zero = True
    logged = []
    for step in range(1, 6):
        state.global_step = step
        logs = {"loss": 0.1, "frac_reward_zero_std": 1.0, "completions/clipped_ratio": 0.0}
        state.log_history.append({**logs, "step": step})
        cb.on_log(None, state, TrainerControl(), logs=logs)
        logged.append(logs)
    assert "health/no_signal" not in logged[1] and logged[2]["health/no_signal"] == 1.0
    assert logged[4]["health/truncated"] == 0.0 and state.log_history[-1]["health/no_signal"] == 1.0
    warned = [w for w in recwarn if issubclass(w.category, RunHealthWarning)]
    assert len(warned) == 1 and "slimrl health (step 3): no learning signal" in str(warned[0].message)
    report = cb.report()
    assert report["no_signal"] == "warned at step 3" and report["truncated"] == "ok"
    assert report["kl"] == "not judged (kl not logged: beta = 0)"
    assert report["reward_conflict"] == "not judged (one reward function)"
    cb.on_log(None, state, TrainerControl(), logs={"eval_loss": 0.3})  # evaluation rows are not training rows
    assert len(cb.history) == 5
