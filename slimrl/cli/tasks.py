"""``slimrl train``'s built-in tasks (``--task``, used when ``--dataset`` is unset): their problems, rewards, tools
and the config values they train with when neither a flag nor the YAML sets them.

- ``arithmetic`` (default): word problems ``a + b`` with a worked example; rewards for the right number and the
  ``<answer>`` tag; every algorithm.
- ``calculator``: two-digit multiplications answered through a calculator tool in TRL's tool loop (GRPO's
  ``tools=``); rewards for the right final answer and a well-formed call; a few supervised steps on tool-call
  demonstrations first (``--warm_start_steps``), since the 135M model makes no call on its own.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TASKS = ("arithmetic", "calculator")
WARM_START_STEPS = 4  # SFT steps of 8 demonstrations: greedy calls 32/32, sampled (T=1) about 1 in 5 after it


@dataclass(frozen=True)
class Task:
    """What ``--task`` fixes: rewards, tools (None: a single-turn task), config defaults, the algorithms it runs."""

    name: str
    rewards: Callable[[], list[Callable]]
    problems: Callable[..., Any]  # (n, seed=) -> a datasets.Dataset with prompt/answer columns
    tools: Callable[[], list[Callable] | None] = lambda: None
    defaults: dict[str, Any] = field(default_factory=dict)
    algorithms: tuple[str, ...] | None = None  # None: every algorithm of the CLI
    sampled_eval: bool = False  # held-out eval sampled at the config's temperature (seeded) instead of greedy


def _arithmetic_problems(n: int, seed: int) -> Any:
    from slimrl.data import make_arithmetic_dataset

    return make_arithmetic_dataset(n, seed=seed)


def _calculator_problems(n: int, seed: int) -> Any:
    from slimrl.data.calculator import make_calculator_dataset

    return make_calculator_dataset(n, seed=seed)


def _arithmetic_rewards() -> list[Callable]:
    from slimrl.data import correctness_reward, format_reward

    return [correctness_reward, format_reward]


def _calculator_rewards() -> list[Callable]:
    from slimrl.data.calculator import answer_reward, tool_call_reward

    return [answer_reward, tool_call_reward]


def _calculator_tools() -> list[Callable]:
    from slimrl.data.calculator import calculator

    return [calculator]


BUILT_IN = {
    "arithmetic": Task("arithmetic", _arithmetic_rewards, _arithmetic_problems),
    # 16 completions a step (2 problems x 8): a call is rare in the first samples, 8 per group gives most groups one;
    # one tool round (call ~30 tokens, result ~20, answer ~12) fits 96 tokens; sampled at T=1 as TRL's default;
    # the held-out eval gives each turn 64 tokens (a call alone is over the arithmetic task's 32) and samples as
    # training does: after the warm start greedy decoding already calls the tool (the most likely first token is
    # the call's), while sampled completions call it about 1 time in 5 — what GRPO changes is the sampled behaviour.
    "calculator": Task(
        "calculator",
        _calculator_rewards,
        _calculator_problems,
        _calculator_tools,
        algorithms=("grpo",),
        sampled_eval=True,
        defaults={
            "per_device_train_batch_size": 16,
            "num_generations": 8,
            "max_completion_length": 96,
            "temperature": 1.0,
            "max_tool_calling_iterations": 1,
            "max_steps": 16,
            "eval_max_new_tokens": 64,
            "learning_rate": 3e-4,
        },
    ),
}


def task_of(name: str) -> Task:
    return BUILT_IN[name]


def make_datasets(task: str, train_size: int, eval_size: int, seed: int):
    """(train, held-out eval or None) of a built-in online task; problems from two different seeds."""
    make = task_of(task).problems
    return make(train_size, seed=seed), (make(eval_size, seed=seed + 1) if eval_size > 0 else None)


def warm_start(model, tokenizer, steps: int, cfg: Any, max_length: int) -> list[float]:
    """``steps`` supervised steps (TRL's SFTTrainer through slimrl, loss on the assistant turns only) on calculator
    demonstrations, 8 a step, on the model GRPO trains next (each cut to ``max_length`` tokens); the losses per
    step."""
    from slimrl import FastLanguageModel, PatchFastRL
    from slimrl.cli.report import use_step_lines
    from slimrl.data.calculator import make_tool_demonstrations

    PatchFastRL("sft", FastLanguageModel)
    from trl import SFTConfig, SFTTrainer

    scratch = tempfile.mkdtemp(prefix="slimrl-warm-start-")  # nothing of it is saved: the adapter trains on
    sft_cfg = SFTConfig(
        output_dir=scratch,
        per_device_train_batch_size=8,
        max_steps=steps,
        learning_rate=5e-4,
        lr_scheduler_type="constant",
        assistant_only_loss=True,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=cfg.seed,
        use_cpu=cfg.use_cpu,
        bf16=cfg.bf16,
        max_length=max_length,
        gradient_checkpointing=bool(cfg.gradient_checkpointing),
    )
    trainer = SFTTrainer(
        model=model,
        args=sft_cfg,
        processing_class=tokenizer,
        train_dataset=make_tool_demonstrations(8 * steps, seed=cfg.seed),
    )
    use_step_lines(trainer)
    try:
        trainer.train()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]
