"""The run-health monitor on real patched trainers (tiny Llama, a few steps): each failure mode made for real fires
its warning and metric; ``slimrl_health=False`` removes it; unpatched TRL has none."""

from __future__ import annotations

import warnings

import pytest

from slimrl import PatchFastRL, unpatch
from slimrl.health import RunHealthWarning, monitor_of
from tests.tiny import CPU_ARGS, tiny_llama, tiny_tokenizer

PROMPTS = [f"{a}+{a + 1}=" for a in range(8)]


def constant(completions, **kwargs):
    return [1.0] * len(completions)


def digits(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


def varied(completions, **kwargs):
    """Differs between nearly any two completions: every group has a learning signal."""
    return [float(sum(map(ord, c)) % 7) for c in completions]


def _train(tmp_path, algorithm: str = "grpo", reward=digits, steps: int = 3, model=None, **overrides):
    """``steps`` patched training steps; (trainer, the RunHealthWarning messages)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    config, trainer_cls = (GRPOConfig, GRPOTrainer) if algorithm == "grpo" else (RLOOConfig, RLOOTrainer)
    args = config(
        **{
            **dict(
                output_dir=str(tmp_path / "out"),
                per_device_train_batch_size=4,
                num_generations=4,
                max_completion_length=8,
                max_steps=steps,
                logging_steps=1,
                learning_rate=1e-3,
                temperature=1.0,
                seed=3,
                gradient_checkpointing=False,
                slimrl_health_window=2,
                slimrl_health_min_groups=1,
                **CPU_ARGS,
            ),
            **overrides,
        }
    )
    trainer = trainer_cls(
        model=model or tiny_llama(),
        args=args,
        reward_funcs=[reward],
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]),
        processing_class=tiny_tokenizer(),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    return trainer, [str(w.message) for w in caught if issubclass(w.category, RunHealthWarning)]


def _saved(tmp_path) -> str:
    """The tiny Llama saved with its tokenizer: TRL loads the policy from the path and the reference beside it."""
    path = tmp_path / "model"
    tiny_llama().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


def _rows(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_a_constant_reward_warns_no_signal(tmp_path, algorithm):
    PatchFastRL(algorithm)
    try:
        trainer, messages = _train(tmp_path, algorithm, reward=constant, beta=0.0)  # no reference model to build
    finally:
        unpatch()
    hits = [m for m in messages if "no learning signal" in m]
    assert len(hits) == 1, messages  # once, though it holds at steps 2 and 3
    assert hits[0].startswith(
        "slimrl health (step 2): no learning signal: in 100% of groups every completion got "
        "the same reward (steps 1-2, frac_reward_zero_std)"
    )
    rows = _rows(trainer)
    assert "health/no_signal" not in rows[0] and [r["health/no_signal"] for r in rows[1:]] == [1.0, 1.0]
    assert monitor_of(trainer).report()["no_signal"] == "warned at step 2"
    print(hits[0])


def test_completions_that_never_finish_warn_truncated(tmp_path):
    PatchFastRL("grpo")
    try:  # the end-of-sequence token can never be sampled: every completion runs to the cap
        trainer, messages = _train(tmp_path, generation_kwargs={"suppress_tokens": [tiny_tokenizer().eos_token_id]})
    finally:
        unpatch()
    hits = [m for m in messages if "completions truncated" in m]
    assert len(hits) == 1 and "100% of completions were cut off at max_completion_length=8" in hits[0], messages
    assert not [m for m in messages if "no learning signal" in m], messages  # the digit reward still spreads
    assert all(r["completions/clipped_ratio"] == 1.0 for r in _rows(trainer))
    print(hits[0])


def test_a_learning_rate_that_blows_up_the_kl_warns(tmp_path):
    PatchFastRL("grpo")
    try:
        trainer, messages = _train(
            tmp_path,
            reward=varied,
            steps=4,
            beta=0.04,
            learning_rate=0.5,
            lr_scheduler_type="constant",
            model=_saved(tmp_path),
        )
    finally:
        unpatch()
    hits = [m for m in messages if "KL runaway" in m]
    assert len(hits) == 1, ([r.get("kl") for r in _rows(trainer)], messages)
    assert _rows(trainer)[-1]["health/kl"] == 1.0
    print(hits[0])


def test_a_sane_learning_rate_keeps_the_kl_check_quiet(tmp_path):
    PatchFastRL("grpo")
    try:
        trainer, messages = _train(
            tmp_path, reward=varied, steps=4, beta=0.04, learning_rate=1e-5, model=_saved(tmp_path)
        )
    finally:
        unpatch()
    assert not [m for m in messages if "KL" in m] and [r["health/kl"] for r in _rows(trainer)[1:]] == [0.0] * 3


def test_switched_off_and_unpatched_trainers_have_no_monitor(tmp_path):
    PatchFastRL("grpo")
    try:
        trainer, messages = _train(tmp_path, reward=constant, steps=2, slimrl_health=False)
    finally:
        unpatch()
    assert monitor_of(trainer) is None and not messages
    assert not any(k.startswith("health/") for r in _rows(trainer) for k in r)
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        **CPU_ARGS,
    )
    alone = GRPOTrainer(
        model=tiny_llama(),
        args=args,
        reward_funcs=[constant],
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]),
        processing_class=tiny_tokenizer(),
    )
    assert monitor_of(alone) is None  # TRL alone (unpatched): no monitor


@pytest.mark.parametrize(
    "value, words",
    [
        (0, "slimrl_health_window=0 is invalid: use an int >= 1"),
        (1.5, "slimrl_health_zero_std=1.5 is invalid: use a fraction in (0, 1]"),
    ],
)
def test_bad_thresholds_are_refused_by_name(tmp_path, value, words):
    from trl import GRPOConfig

    name = "slimrl_health_window" if "window" in words else "slimrl_health_zero_std"
    PatchFastRL("grpo")
    try:
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("]", r"\]")):
            GRPOConfig(output_dir=str(tmp_path), **{name: value}, **CPU_ARGS)
    finally:
        unpatch()
