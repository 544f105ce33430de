"""``slimrl train``: TRL's trainers through slimrl, with an embedded default that learns on a CPU.

``--algorithm`` picks the trainer: ``grpo`` (default) and ``rloo`` learn online from rewards; ``dpo``, ``orpo``,
``cpo`` from preference pairs, ``kto`` from unpaired good/bad examples, ``sft`` from demonstrations. Every field
of that trainer's config (``GRPOConfig``, ``DPOConfig``, ...) is a flag and a YAML key (TRL's own ``TrlParser``),
and so are slimrl's options (:class:`TrainArguments`). With no arguments: SmolLM2-135M-Instruct + LoRA on seeded
arithmetic word problems (rewards for the right number and for the ``<answer>`` tag; for the offline algorithms,
the right answer vs a near miss), greedy eval on a held-out split before and after.

Order of work: parse (through the patched config) -> check everything that needs no model: options, the output
directory (writable, locked for this run, no earlier run replaced unasked), rewards, dataset, the checkpoint to
resume, the model source, prompt lengths (one clear line on error, exit 2) -> load the model -> eval -> train
(checkpoints every ``save_steps``; ``--resume`` continues) -> eval -> save adapter, tokenizer, metrics, plot ->
summary table. Ctrl-C or SIGTERM stops with a line saying what was saved; a reward function or NaN/inf failure
is one line too (exit 1), its traceback in ``<output_dir>/slimrl-error.log``.
"""

from __future__ import annotations

import signal
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from slimrl.cli.args import ALGORITHMS, ONLINE, TrainArguments, parse
from slimrl.cli.data import fit_prompts, load_dataset_arg, load_rewards
from slimrl.cli.evaluate import held_out_eval
from slimrl.cli.oneline import fail
from slimrl.cli.outputs import (
    RunRecordCallback,
    check_output_dir,
    checkpoints,
    pick_checkpoint,
    refuse_earlier_run,
    run_lock,
    run_record,
)
from slimrl.cli.resume import check_resume_matches
from slimrl.cli.tasks import WARM_START_STEPS, task_of, warm_start
from slimrl.errors import InputError

__all__ = ["main", "parse", "run", "TrainArguments", "ALGORITHMS"]
ERROR_LOG = "slimrl-error.log"


def memory_fraction(value: str) -> float | str:
    """``--gpu_memory_utilization``: 'auto' or a float in (0, 1)."""
    if value == "auto":
        return value
    try:
        fraction = float(value)
    except ValueError:
        fraction = -1.0
    if not 0 < fraction < 1:
        raise InputError(f"--gpu_memory_utilization {value}: pass a fraction between 0 and 1, or auto")
    return fraction


def validate(targs: TrainArguments, cfg: Any) -> None:
    """What the config's own checks cannot see: slimrl's options against each other and the config, and the values
    that cannot run (:mod:`slimrl.cli.value_checks`)."""
    from slimrl.cli.tasks import TASKS
    from slimrl.cli.value_checks import check_config, check_options, check_task

    check_task(targs.task, TASKS)  # first: the checks below look it up
    algorithm = targs.algorithm
    if targs.use_gradient_checkpointing.lower() not in ("slimrl", "unsloth", "selective", "true", "false"):
        raise InputError(
            f"--use_gradient_checkpointing {targs.use_gradient_checkpointing}: use slimrl, selective, true or false"
        )
    if targs.reward and algorithm not in ONLINE:
        raise InputError(
            f"--reward: --algorithm {algorithm} learns from its dataset, not from reward functions; "
            f"drop --reward or use --algorithm {' / '.join(ONLINE)}"
        )
    task = task_of(targs.task)
    if targs.task != "arithmetic" and targs.dataset is not None:
        raise InputError(
            f"--task {targs.task} and --dataset: the built-in task brings its own problems; pass one of them"
        )
    if task.algorithms and algorithm not in task.algorithms:
        raise InputError(
            f"--task {targs.task}: runs with --algorithm {' / '.join(task.algorithms)} (TRL's tool "
            f"loop is GRPO's), not {algorithm}"
        )
    if targs.warm_start_steps is not None and (targs.task != "calculator" or targs.warm_start_steps < 0):
        raise InputError(f"--warm_start_steps {targs.warm_start_steps}: a count >= 0, for --task calculator only")
    if targs.dataset is None and targs.train_size < 1:
        raise InputError(f"--train_size {targs.train_size}: the built-in task needs at least 1 training problem")
    if targs.eval_size < 0:
        raise InputError(f"--eval_size {targs.eval_size}: must be >= 0 (0: no held-out evaluation)")
    if targs.eval_max_new_tokens < 1:
        raise InputError(
            f"--eval_max_new_tokens {targs.eval_max_new_tokens}: must be >= 1 (--eval_size 0 skips the evaluation)"
        )
    iterations = getattr(cfg, "max_tool_calling_iterations", None)
    if iterations is not None and iterations < 0:
        raise InputError(
            f"--max_tool_calling_iterations {iterations}: must be >= 0 (a negative count would turn the tool loop off)"
        )
    if targs.lora_r < 1:
        raise InputError(f"--lora_r {targs.lora_r}: the LoRA rank must be >= 1")
    if targs.threads is not None and targs.threads < 1:
        raise InputError(f"--threads {targs.threads}: must be >= 1")
    if cfg.learning_rate <= 0:  # the library warns about 0 (refuses < 0): `slimrl train` refuses both
        raise InputError(f"--learning_rate {cfg.learning_rate}: must be > 0 (e.g. 2e-4 for LoRA)")
    if targs.truncate_prompts and targs.drop_long_prompts:
        raise InputError("--truncate_prompts and --drop_long_prompts: pass one of them")
    if algorithm in ONLINE and cfg.max_completion_length >= targs.max_seq_length:
        raise InputError(
            f"--max_completion_length {cfg.max_completion_length} leaves no room for the prompt in "
            f"--max_seq_length {targs.max_seq_length}; lower the first or raise the second"
        )
    max_length = getattr(cfg, "max_length", None)
    if algorithm not in ONLINE and max_length is not None and max_length > targs.max_seq_length:
        raise InputError(
            f"--max_length {max_length} is over --max_seq_length {targs.max_seq_length}; lower the "
            f"first or raise the second"
        )
    memory_fraction(targs.gpu_memory_utilization)
    check_options(targs)
    check_config(cfg, type(cfg))


def built_in_tools(targs: TrainArguments) -> list | None:
    """The built-in task's tools (None: no tools, or a user dataset)."""
    return task_of(targs.task).tools() if targs.dataset is None else None


def tool_template(tokenizer, targs: TrainArguments) -> str | None:
    """:func:`slimrl.data.calculator.use_tool_template` on ``tokenizer``; its refusal as a InputError naming
    ``--model``."""
    from slimrl.data.calculator import use_tool_template

    try:
        return use_tool_template(tokenizer)
    except ValueError as err:
        raise InputError(f"--model {targs.model}: {err}") from None


def resolve_model(targs: TrainArguments) -> Path:
    """``--model`` as a local directory (built-in alias, .gguf, directory, hub cache or download); one line for a
    path that does not exist, a directory without config.json, an incomplete GGUF, an unreachable hub id."""
    from slimrl.models.loader import resolve_model_path

    try:
        return resolve_model_path(targs.model)
    except (FileNotFoundError, ValueError) as err:
        message = str(err).replace(f"model_name={targs.model!r}", "").lstrip(" :")
        raise InputError(f"--model {targs.model}: {message}") from None


# ---------------------------------------------------------------- the run


def run(targs: TrainArguments, cfg: Any, deferred: list | None = None) -> dict[str, Any]:
    """Everything after parsing; returns the summary as a dict (also printed). ``deferred``: warnings recorded
    while parsing, shown once the options are known to be valid (an error is then one line, not a warning too)."""
    from slimrl.patching import trainer_and_config

    trainer_cls = trainer_and_config(targs.algorithm)[0]  # patched by parse()
    validate(targs, cfg)
    for w in deferred or ():
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    out = check_output_dir(cfg.output_dir)
    with run_lock(out):
        refuse_earlier_run(out, resume=targs.resume is not None, overwrite=targs.overwrite_output_dir)
        rewards = load_rewards(targs.reward, targs.task)
        train_ds, eval_ds = load_dataset_arg(targs, cfg.seed, trainer_cls, cfg)
        record = run_record(targs.algorithm, targs.lora_r, targs.model)
        resume_from = pick_checkpoint(targs.resume, out) if targs.resume else None
        if resume_from is not None:
            check_resume_matches(resume_from, record)
        model_path = resolve_model(targs)
        if targs.algorithm in ONLINE:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model_path))
            if built_in_tools(targs):  # the tool template fits, checked before the model loads
                tool_template(tokenizer, targs)
            train_ds = fit_prompts(
                train_ds, tokenizer, targs, cfg.max_completion_length, targs.dataset or "built-in task"
            )
        from slimrl.compat.runtime.threads import apply_threads

        print(apply_threads(targs.threads), flush=True)
        return train_and_report(
            targs, cfg, trainer_cls, out, model_path, rewards, train_ds, eval_ds, resume_from, record
        )


def train_and_report(
    targs,
    cfg,
    trainer_cls,
    out: Path,
    model_path: Path,
    rewards,
    train_ds,
    eval_ds,
    resume_from: Path | None,
    record: dict,
) -> dict[str, Any]:
    """Load, evaluate, train, evaluate, save, report (every input already checked)."""
    import torch

    from slimrl import FastLanguageModel
    from slimrl.cli.report import MetricsFileCallback, plot_for, print_summary, use_step_lines
    from slimrl.cli.resume import train_or_finish
    from slimrl.compat.memory import peak_window
    from slimrl.health import monitor_of

    t_start = time.time()
    with peak_window(torch.device("cuda" if torch.cuda.is_available() else "cpu")) as window:
        model, tokenizer = FastLanguageModel.from_pretrained(
            str(model_path),
            max_seq_length=targs.max_seq_length,
            load_in_4bit=targs.load_in_4bit,
            fast_inference=targs.fast_inference,
            max_lora_rank=targs.lora_r,
            gpu_memory_utilization=memory_fraction(targs.gpu_memory_utilization),
        )
        gc_mode: str | bool = {"true": True, "false": False}.get(
            targs.use_gradient_checkpointing.lower(), targs.use_gradient_checkpointing.lower()
        )
        model = FastLanguageModel.get_peft_model(
            model,
            r=targs.lora_r,
            lora_alpha=targs.lora_alpha,
            lora_dropout=targs.lora_dropout,
            use_gradient_checkpointing=gc_mode,
            random_state=cfg.seed,
        )
        if resume_from is not None:
            check_resume_matches(resume_from, record, model)
        tools = built_in_tools(targs)
        if tools and (said := tool_template(tokenizer, targs)):
            print(f"slimrl train: {said}", flush=True)

        sampled = targs.dataset is None and task_of(targs.task).sampled_eval
        temperature = cfg.temperature if sampled else None

        def evaluate():
            return (
                held_out_eval(
                    model,
                    tokenizer,
                    eval_ds,
                    rewards,
                    targs.eval_max_new_tokens,
                    tools=tools,
                    temperature=temperature,
                    seed=cfg.seed,
                )
                if eval_ds
                else None
            )

        before, warmed = evaluate(), None
        steps = WARM_START_STEPS if targs.warm_start_steps is None else targs.warm_start_steps
        if tools and steps and resume_from is None:  # a resumed run's adapter already holds its warm start
            print(f"slimrl train: warm start: {steps} supervised steps on tool-call demonstrations", flush=True)
            warm_start(model, tokenizer, steps, cfg, targs.max_seq_length)
            warmed = evaluate()
        online = ({"reward_funcs": rewards} if targs.algorithm in ONLINE else {}) | ({"tools": tools} if tools else {})
        trainer = trainer_cls(
            model=model,
            args=cfg,
            train_dataset=train_ds,
            processing_class=tokenizer,
            callbacks=[MetricsFileCallback(out), RunRecordCallback(record)],
            **online,
        )
        if len(trainer.train_dataset) == 0:  # TRL dropped every row (e.g. all longer than max_length)
            raise InputError(
                f"--dataset {targs.dataset or 'built-in task'}: no row is left after TRL's "
                f"preprocessing (every row is longer than --max_length {getattr(cfg, 'max_length', '?')}"
                f"?); raise --max_length"
            )
        use_step_lines(trainer)
        train_or_finish(trainer, resume_from)
        after = evaluate()
        adapter_dir = out / "adapter"
        trainer.save_model(str(adapter_dir))
        tokenizer.save_pretrained(str(adapter_dir))
        if targs.export:
            from slimrl.export.formats import export_all, parse_formats

            print(f"slimrl train: exporting to {out / 'export'}", flush=True)
            export_all(model, tokenizer, out / "export", *parse_formats(targs.export, "--export"))
        plot = plot_for(out, targs.algorithm in ONLINE)
        monitor = monitor_of(trainer)
        return print_summary(
            targs.algorithm,
            trainer.state.global_step,
            time.time() - t_start,
            window.peak_bytes() / 2**20,
            out,
            plot,
            before,
            after,
            len(eval_ds) if eval_ds else 0,
            resume_from,
            health=monitor.report() if monitor is not None else None,
            warmed=warmed,
            eval_how=f"sampled at T={temperature}" if sampled else "greedy",
        )


def _interrupted_message(cfg: Any) -> str:
    out = Path(getattr(cfg, "output_dir", "") or ".")
    saved = [c for c in checkpoints(out) if (c / "trainer_state.json").is_file()] if out.is_dir() else []
    if saved:
        return (
            f"slimrl train: interrupted; the checkpoints written so far are intact (newest: {saved[0]}): "
            f"continue with `slimrl train --resume` (same options)"
        )
    return "slimrl train: interrupted before the first checkpoint; nothing was saved yet (run again to start over)"


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from slimrl.patching.every_trainer.nonfinite import NonFiniteStepError
    from slimrl.patching.every_trainer.reward_guard import RewardFunctionError, RewardOutputError

    cfg = None
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
    try:
        with warnings.catch_warnings(record=True) as held:
            targs, cfg = parse(argv)
        run(targs, cfg, deferred=held)
    except InputError as err:
        return fail("slimrl train", str(err))
    except KeyboardInterrupt:
        print(_interrupted_message(cfg), file=sys.stderr)
        return 130
    except (RewardFunctionError, RewardOutputError, NonFiniteStepError) as err:
        log = Path(cfg.output_dir) / ERROR_LOG
        try:
            log.write_text(traceback.format_exc())
            where = f" (traceback: {log})"
        except OSError:
            where = ""
        print(f"slimrl train: error: {err}{where}", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
