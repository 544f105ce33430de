"""Bad input that ended in a traceback or was accepted silently, each now one line (exit 2) naming the argument and
the fix: ``slimrl plan`` and ``slimrl verify`` on broken, empty or unknown configs and damaged GGUF files, sizes that
overflow, ``beta`` NaN or negative, a batch ``num_generations`` does not divide; ``slimrl train`` with
``--eval_max_new_tokens 0`` or ``--max_tool_calling_iterations -1``; a resume checkpoint whose JSON has the wrong
types or whose ``.pt`` holds a pickle that would run code."""

from __future__ import annotations

import os

import pytest
import torch

from slimrl.cli import plan as plan_cli
from slimrl.cli import train
from slimrl.cli import verify as verify_cli
from slimrl.cli.outputs import pick_checkpoint
from slimrl.errors import InputError


@pytest.fixture
def bad_models(tmp_path):
    made = {}
    for name, text in (("broken", "{not json"), ("empty", "{}"), ("unknown", '{"model_type": "nosuchmodel"}')):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(text)
        made[name] = tmp_path / name
    made["noise.gguf"] = tmp_path / "noise.gguf"
    made["noise.gguf"].write_bytes(os.urandom(1000))
    made["cut.gguf"] = tmp_path / "cut.gguf"
    made["cut.gguf"].write_bytes(b"GGUF\x03\x00\x00\x00")
    return made


def _one_line(capsys, code: int, prog: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    lines = [ln for ln in err if ln.startswith(f"{prog}: error: ")]
    assert code == 2 and len(lines) == 1 and not any("Traceback" in ln for ln in err), err
    return lines[0]


@pytest.mark.parametrize("which", ["broken", "empty", "unknown", "noise.gguf", "cut.gguf"])
def test_plan_and_verify_name_an_unreadable_model_in_one_line(bad_models, capsys, which):
    line = _one_line(capsys, plan_cli.main(["--model", str(bad_models[which])]), "slimrl plan")
    assert f"--model {bad_models[which]}" in line
    line = _one_line(
        capsys,
        verify_cli.main(["--algorithm", "grpo", "--loss_type", "dapo", "--model", str(bad_models[which])]),
        "slimrl verify",
    )
    assert str(bad_models[which]) in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max_completion_length", "100000000000000000000"], "--max_completion_length 100000000000000000000: larger"),
        (
            [
                "--per_device_train_batch_size",
                "16777216",
                "--num_generations",
                "16777216",
                "--max_completion_length",
                "16777216",
            ],
            "beyond what can be planned",
        ),
        (["--beta", "nan"], "--beta nan: the KL coefficient is a number >= 0"),
        (["--lora_r", str(10**20)], "--lora_r 100000000000000000000: a LoRA rank in [1, 65536]"),
        (["--lora_r", "-1"], "--lora_r -1: a LoRA rank in [1, 65536], or 0 for full fine-tuning"),
        (["--beta", "-1"], "--beta -1.0: the KL coefficient is a number >= 0"),
        (["--per_device_train_batch_size", "8", "--num_generations", "3"], "a multiple of --num_generations 3"),
    ],
)
def test_plan_refuses_what_training_would(capsys, argv, message):
    line = _one_line(capsys, plan_cli.main(argv), "slimrl plan")
    assert message in line, line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--eval_max_new_tokens", "0"], "--eval_max_new_tokens 0: must be >= 1"),
        (["--task", "calculator", "--max_tool_calling_iterations", "-1"], "--max_tool_calling_iterations -1: must be"),
    ],
)
def test_train_refuses_before_the_model_loads(capsys, tmp_path, monkeypatch, argv, message):
    from slimrl.models import fast_language_model

    def boom(*a, **k):
        raise AssertionError("the model was loaded before the input was validated")

    monkeypatch.setattr(fast_language_model.FastLanguageModel, "from_pretrained", staticmethod(boom))
    line = _one_line(capsys, train.main(["--output_dir", str(tmp_path / "out"), *argv]), "slimrl train")
    assert message in line, line


class _RunsCode:
    """A pickle that would run a command when loaded without ``weights_only``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("damage", ["state-types", "state-list", "run-types", "pickle"])
def test_a_resume_checkpoint_with_wrong_types_or_a_code_pickle_is_refused(tmp_path, damage):
    ckpt = tmp_path / "out" / "checkpoint-2"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text('{"global_step": 2, "log_history": []}')
    torch.save(
        {"state": {}, "param_groups": [{"params": [0], "lr": 1e-5}, {"params": [], "lr": 1e-5}]}, ckpt / "optimizer.pt"
    )  # the Trainer's empty no-decay group under LoRA
    from transformers import TrainingArguments

    torch.save(TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[]), ckpt / "training_args.bin")
    assert pick_checkpoint(str(ckpt), tmp_path / "out") == ckpt  # intact: accepted
    marker = tmp_path / "pwned"
    if damage == "state-types":
        (ckpt / "trainer_state.json").write_text('{"global_step": "two", "log_history": []}')
    elif damage == "state-list":
        (ckpt / "trainer_state.json").write_text("[1, 2]")
    elif damage == "run-types":
        (ckpt / "slimrl_run.json").write_text('{"algorithm": ["grpo"], "lora_r": 16, "model": "m"}')
    else:
        torch.save(_RunsCode(marker), ckpt / "optimizer.pt")
    with pytest.raises(InputError, match=r"--resume .*: .* is damaged; pass an intact checkpoint"):
        pick_checkpoint(str(ckpt), tmp_path / "out")
    assert not marker.exists()  # nothing of the pickle ran


@pytest.mark.parametrize(
    "damage",
    [
        "state-key",
        "log-history",
        "step-huge",
        "step-negative",
        "target-modules",
        "nan-adapter",
        "ref-truncated",
        "optimizer-shape",
        "scheduler-shape",
        "rng-shape",
        "optimizer-no-groups",
        "optimizer-bad-ids",
        "scheduler-types",
        "scheduler-lrs",
    ],
)
def test_a_checkpoint_that_would_fail_inside_transformers_is_damaged(tmp_path, damage):
    """Checkpoints that passed the damage check and then failed inside transformers or TRL: each is named, and
    ``--resume latest`` falls back to an older one."""
    import json

    from safetensors.torch import save_file

    from tests.cli.test_reliability import _checkpoint

    out = tmp_path / "out"
    _checkpoint(out, 2)
    ckpt = _checkpoint(out, 4)
    state = {"global_step": 4, "log_history": []}
    if damage == "state-key":
        state["not_a_field"] = 1
    elif damage == "log-history":
        state["log_history"] = [1, "x"]
    elif damage in ("step-huge", "step-negative"):
        state["global_step"] = 10**15 if damage == "step-huge" else -5
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    if damage == "target-modules":
        (ckpt / "adapter_config.json").write_text(json.dumps({"r": 16, "target_modules": 5}))
    elif damage == "nan-adapter":
        save_file({"a": torch.full((2, 2), float("nan"))}, ckpt / "adapter_model.safetensors")
    elif damage == "ref-truncated":
        (ckpt / "ref").mkdir()
        save_file({"a": torch.zeros(64, 64)}, ckpt / "ref" / "adapter_model.safetensors")
        data = (ckpt / "ref" / "adapter_model.safetensors").read_bytes()
        (ckpt / "ref" / "adapter_model.safetensors").write_bytes(data[:-100])
    elif damage == "optimizer-shape":
        torch.save([1, 2, 3], ckpt / "optimizer.pt")
    elif damage == "scheduler-shape":
        torch.save([1], ckpt / "scheduler.pt")
    elif damage == "optimizer-no-groups":
        torch.save({"state": {}, "param_groups": []}, ckpt / "optimizer.pt")
    elif damage == "optimizer-bad-ids":
        torch.save({"state": {}, "param_groups": [{"params": ["w"], "lr": 1e-5}]}, ckpt / "optimizer.pt")
    elif damage == "scheduler-types":
        torch.save({"last_epoch": "3", "_step_count": 4}, ckpt / "scheduler.pt")
    elif damage == "scheduler-lrs":
        torch.save({"last_epoch": 3, "base_lrs": ["fast"]}, ckpt / "scheduler.pt")
    elif damage == "rng-shape":
        torch.save({"python": (1, 2), "numpy": None, "cpu": torch.zeros(3)}, ckpt / "rng_state.pth")
    with pytest.raises(InputError, match=r"--resume .*: .* is damaged; pass an intact checkpoint"):
        pick_checkpoint(str(ckpt), out)
    with pytest.warns(UserWarning, match="checkpoint-4 is damaged"):
        assert pick_checkpoint("latest", out).name == "checkpoint-2"


def test_an_intact_checkpoint_with_rng_states_resumes(tmp_path):
    import random

    import numpy as np

    from tests.cli.test_reliability import _checkpoint

    ckpt = _checkpoint(tmp_path / "out", 2)
    torch.save(
        {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()},
        ckpt / "rng_state.pth",
    )
    torch.save({"last_epoch": 1}, ckpt / "scheduler.pt")
    assert pick_checkpoint("latest", tmp_path / "out") == ckpt


@pytest.mark.parametrize("case", ["nul", "date", "too-long"])
def test_an_output_dir_no_filesystem_can_take_is_one_line(capsys, tmp_path, monkeypatch, case):
    """Round 7: ``"a\\0b"`` and an unquoted date from YAML, and a name longer than the filesystem's 255 bytes, ended
    in tracebacks (``embedded null byte``, ``TypeError: ... not date``, ``File name too long``)."""
    from slimrl.models import fast_language_model

    monkeypatch.setattr(
        fast_language_model.FastLanguageModel,
        "from_pretrained",
        staticmethod(lambda *a, **k: pytest.fail("the model was loaded before the input was checked")),
    )
    config = tmp_path / "run.yaml"
    if case == "too-long":
        argv = ["--output_dir", str(tmp_path / ("x" * 300))]
        message = "too long for the filesystem"
    else:
        config.write_text('output_dir: "a\\0b"\n' if case == "nul" else "output_dir: 2026-12-02\n")
        argv = ["--config", str(config)]
        message = "holds a NUL character" if case == "nul" else "YAML read 2026-12-02 as a date"
    line = _one_line(capsys, train.main(argv), "slimrl train")
    assert message in line, line
