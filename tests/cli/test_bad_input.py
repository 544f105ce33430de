"""`slimrl train` bad input: one clear line naming the argument and the fix, exit 2, before any model loads."""

from __future__ import annotations

import json

import pytest

from slimrl.cli import train


@pytest.fixture(autouse=True)
def no_model_load(monkeypatch):
    """Any of these errors must come before the model loads."""
    from slimrl.models import fast_language_model

    def boom(*a, **k):
        raise AssertionError("the model was loaded before the input was validated")

    monkeypatch.setattr(fast_language_model.FastLanguageModel, "from_pretrained", staticmethod(boom))


def _err(capsys, argv, tmp_path):
    code = train.main(["--output_dir", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0, f"expected one line, got: {err!r}"
    return err


def test_unknown_key_suggests_the_right_one(capsys, tmp_path):
    err = _err(capsys, ["--lerning_rate", "1e-5"], tmp_path)
    assert "unknown option --lerning_rate" in err and "did you mean --learning_rate?" in err


def test_unknown_yaml_key(capsys, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("max_steps: 2\nlerning_rate: 1\n")
    err = _err(capsys, ["--config", str(cfg)], tmp_path)
    assert f"--config {cfg}: unknown key 'lerning_rate': did you mean learning_rate?" in err


def test_missing_dataset_file(capsys, tmp_path):
    err = _err(capsys, ["--dataset", str(tmp_path / "nope.jsonl")], tmp_path)
    assert "--dataset" in err and "file not found" in err


def test_dataset_without_prompt_column(capsys, tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"question": f"{i}+1="}) for i in range(8)))
    err = _err(capsys, ["--dataset", str(path)], tmp_path)
    assert "no 'prompt' column (columns: question)" in err and "rename" in err


def test_reward_that_does_not_import(capsys, tmp_path):
    err = _err(capsys, ["--reward", "no_such_module_xyz:score"], tmp_path)
    assert "--reward 'no_such_module_xyz:score': cannot import module 'no_such_module_xyz'" in err


def test_reward_not_callable(capsys, tmp_path):
    err = _err(capsys, ["--reward", "tests.cli.rewards:NOT_CALLABLE"], tmp_path)
    assert "is missing or not callable" in err


def test_reward_spec_without_colon(capsys, tmp_path):
    err = _err(capsys, ["--reward", "tests.cli.rewards"], tmp_path)
    assert "write it as module:function" in err


def test_batch_is_fixed_as_in_the_python_api(tmp_path):
    """The CLI parses the patched GRPOConfig: a batch num_generations does not divide is fixed with the same
    warning as ``GRPOConfig(...)`` in Python, not an error only the CLI raises."""
    with pytest.warns(
        UserWarning,
        match=r"not a multiple of num_generations=4: slimrl set "
        r"per_device_train_batch_size=4",
    ):
        _, cfg = train.parse(
            ["--per_device_train_batch_size", "6", "--num_generations", "4", "--output_dir", str(tmp_path)]
        )
    assert cfg.per_device_train_batch_size == 4


@pytest.mark.parametrize("value", ["0", "-1", "10.5"])
def test_temperature_is_checked_as_in_the_python_api(capsys, tmp_path, value):
    err = _err(capsys, ["--temperature", value], tmp_path)
    assert f"temperature={float(value)} is invalid: it must be > 0 and <= 10" in err


def test_cli_after_patchfastrl_in_the_same_process(tmp_path):
    """A script that patched TRL itself can still call the CLI (its options must not clash with slimrl's
    config fields: argparse's "conflicting option strings: --unsloth_num_chunks")."""
    from slimrl import PatchFastRL, unpatch

    PatchFastRL()
    try:
        targs, cfg = train.parse(
            ["--unsloth_num_chunks", "4", "--max_seq_length", "256", "--output_dir", str(tmp_path)]
        )
        assert (cfg.unsloth_num_chunks, cfg.max_seq_length, targs.max_seq_length) == (4, 256, 256)
    finally:
        unpatch()


def test_flag_of_the_wrong_type_is_one_line(capsys, tmp_path):
    err = _err(capsys, ["--max_steps", "abc"], tmp_path)
    assert "error: --max_steps: invalid int value: 'abc'" in err


def test_completion_longer_than_max_seq_length(capsys, tmp_path):
    err = _err(capsys, ["--max_completion_length", "600", "--max_seq_length", "512"], tmp_path)
    assert "--max_completion_length 600 leaves no room for the prompt in --max_seq_length 512" in err


def test_resume_without_checkpoint(capsys, tmp_path):
    err = _err(capsys, ["--resume"], tmp_path)
    assert "--resume: no intact checkpoint" in err


@pytest.mark.parametrize(
    "argv,words",
    [
        (
            ["--task", "calculater"],
            "--task calculater: did you mean calculator? the built-in tasks are arithmetic, calculator",
        ),
        (["--task", "calculator", "--algorithm", "dpo"], "--task calculator: runs with --algorithm grpo"),
        (
            ["--task", "calculator", "--dataset", "x.jsonl"],
            "--task calculator and --dataset: the built-in task brings its own problems",
        ),
        (["--task", "calculator", "--warm_start_steps", "-1"], "--warm_start_steps -1: a count >= 0"),
        (["--warm_start_steps", "2"], "--warm_start_steps 2: a count >= 0, for --task calculator only"),
    ],
)
def test_task_mistakes_are_one_line(capsys, tmp_path, argv, words):
    assert words in _err(capsys, argv, tmp_path)


def test_calculator_task_sets_its_defaults_and_flags_win():
    from slimrl.cli.args import parse

    targs, cfg = parse(["--task", "calculator"])
    assert (
        cfg.num_generations,
        cfg.max_completion_length,
        cfg.max_tool_calling_iterations,
        cfg.temperature,
        targs.eval_max_new_tokens,
    ) == (8, 96, 1, 1.0, 64)
    targs, cfg = parse(["--task", "calculator", "--num_generations", "4", "--eval_max_new_tokens", "40"])
    assert (cfg.num_generations, targs.eval_max_new_tokens) == (4, 40)
    targs, cfg = parse([])
    assert (targs.task, cfg.num_generations, cfg.max_completion_length, targs.eval_max_new_tokens) == (
        "arithmetic",
        4,
        32,
        32,
    )


def test_calculator_task_on_a_model_whose_template_cannot_show_tools(capsys, tmp_path):
    from tests.tiny import tiny_llama, tiny_tokenizer

    tiny_llama().save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")  # no chat template at all
    capsys.readouterr()  # the save's progress bar
    err = _err(capsys, ["--task", "calculator", "--model", str(tmp_path / "model")], tmp_path)
    assert f"--model {tmp_path / 'model'}: the model's chat template shows no tools and is not ChatML" in err


@pytest.mark.parametrize("spelling", ["--accelerator_config", "--accelerator-config", "--deepspeed", "--fsdp-config"])
@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("/nonexistent/acc.json", "no such file or directory"),
        ("{bad json", "not valid JSON"),
        ("[1, 2]", "a JSON object"),
    ],
)
def test_every_spelling_of_a_file_option_gets_its_check(capsys, tmp_path, spelling, value, needle):
    """argparse takes the hyphenated spelling too: the check runs on the option, not on how it was written."""
    err = _err(capsys, [spelling, value], tmp_path)
    assert needle in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "output_dir: 123\n",
            "key output_dir: YAML read 123 as a number; this option takes a string (quote it: '123')",
        ),
        ("bf16: maybe\n", "key bf16: 'maybe' is not a valid"),
        ("1: 2\n", "key 1 is not an option name"),
    ],
)
def test_yaml_values_of_the_wrong_type_are_one_line(capsys, tmp_path, text, expected):
    """YAML turns unquoted values into numbers and booleans and allows non-string keys: each gets one line."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(text)
    err = _err(capsys, ["--config", str(cfg)], tmp_path)
    assert f"--config {cfg}: {expected}" in err
