"""TRL's own example scripts, run from where they are installed (``trl/scripts/*.py`` inside the trl wheel: other
people's code, never copied here) with the one-line ``PatchFastRL()`` in front, the rule of
``../shared/real_scripts/README.md``:

1. one first line, ``from slimrl import PatchFastRL; PatchFastRL()`` (here: run before ``runpy`` runs the script);
2. the model (student and teacher) -> the embedded SmolLM2-135M-Instruct (a local directory);
3. ``--dataset_name <hub id>`` -> a local directory with the Hub dataset's columns and value formats, written here
   (conversational rows as in TRL's ``trl-lib`` datasets);
4. sizes cut for a CPU (``--max_steps 1``, small batches, short completions);
5. the script's own command (its docstring's LoRA command where it has one) with GPU-era settings kept: TRL's
   parser hands every config field over, so TRL's ``bf16`` default is "passed" and, without slimrl, stops on a CPU.

Each runs in its own process, offline, and must exit 0 having saved its model: ``distillation.py``
(``DistillationTrainer``, a first-contact trainer), ``kto.py``, ``reward.py`` and ``grpo.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

LAUNCH = (
    "import runpy, sys; from slimrl import PatchFastRL; PatchFastRL(); sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def _rows(name: str) -> list[dict]:
    """The Hub dataset's columns for each script (seeded, small)."""
    questions = [(f"What is {a} + {b}?", str(a + b)) for a, b in zip(range(2, 14), range(5, 17), strict=True)]
    if name == "distillation":  # trl-lib/ultrafeedback-prompt: a conversational prompt
        return [{"prompt": _user(q)} for q, _ in questions]
    if name == "kto":  # trl-lib/kto-mix-14k: prompt, completion, label
        return [
            {"prompt": _user(q), "completion": _assistant(a if i % 2 else "I do not know."), "label": bool(i % 2)}
            for i, (q, a) in enumerate(questions)
        ]
    if name == "reward":  # trl-lib/ultrafeedback_binarized: chosen and rejected conversations, their scores
        return [
            {
                "chosen": _user(q) + _assistant(a),
                "rejected": _user(q) + _assistant("No idea."),
                "score_chosen": 8.0,
                "score_rejected": 2.0,
            }
            for q, a in questions
        ]
    return [{"prompt": _user(q), "solution": a} for q, a in questions]  # GRPO: a prompt and its solution


COMMANDS = {  # the docstring's (LoRA) command of each script, with the changes of the module docstring
    "distillation": [
        "--teacher_model_name_or_path",
        "{model}",
        "--learning_rate",
        "2.0e-4",
        "--num_train_epochs",
        "1",
        "--use_peft",
        "--lora_r",
        "32",
        "--lora_alpha",
        "16",
        "--max_completion_length",
        "16",
    ],
    "kto": [
        "--per_device_train_batch_size",
        "2",
        "--num_train_epochs",
        "1",
        "--learning_rate",
        "5e-7",
        "--lr_scheduler_type=cosine",
        "--gradient_accumulation_steps",
        "1",
        "--eval_steps",
        "500",
        "--warmup_steps",
        "0.1",
        "--logging_first_step",
        "--use_peft",
        "--lora_r",
        "16",
        "--lora_alpha",
        "16",
    ],
    "reward": [
        "--per_device_train_batch_size",
        "2",
        "--num_train_epochs",
        "1",
        "--learning_rate",
        "1.0e-5",
        "--max_length",
        "256",
        "--use_peft",
        "--lora_task_type",
        "SEQ_CLS",
        "--lora_r",
        "16",
        "--lora_alpha",
        "16",
    ],
    "grpo": [
        "--reward_funcs",
        "think_format_reward",
        "--per_device_train_batch_size",
        "2",
        "--num_generations",
        "2",
        "--max_completion_length",
        "16",
        "--use_peft",
        "--lora_r",
        "16",
        "--lora_alpha",
        "16",
    ],
}


@pytest.fixture(scope="module")
def smollm2() -> str:
    from slimrl.models.loader import materialize_gguf, smollm2_gguf_path

    return str(materialize_gguf(smollm2_gguf_path()))


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_trls_installed_script_runs_to_the_end_with_the_patch(tmp_path, smollm2, name):
    import trl

    script = Path(trl.__file__).parent / "scripts" / f"{name}.py"
    if not script.is_file():
        pytest.skip(f"the installed trl ships no scripts/{name}.py")
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(name)))
    out = tmp_path / "out"
    flags = [a.format(model=smollm2) for a in COMMANDS[name]]
    argv = [
        str(script),
        "--model_name_or_path",
        smollm2,
        "--dataset_name",
        str(data),
        "--output_dir",
        str(out),
        "--max_steps",
        "1",
        "--report_to",
        "none",
        *flags,
    ]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    done = subprocess.run(
        [sys.executable, "-c", LAUNCH, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert any(out.glob("*.safetensors")), sorted(p.name for p in out.iterdir())
    assert "settings changed" in done.stdout  # TRL's bf16 default, which the CPU cannot run, in the table
