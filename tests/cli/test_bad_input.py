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
    assert "unknown key 'lerning_rate' in the --config file: did you mean learning_rate?" in err


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


def test_num_generations_must_divide_the_batch(capsys, tmp_path):
    err = _err(capsys, ["--per_device_train_batch_size", "6", "--num_generations", "4"], tmp_path)
    assert "num_generations" in err and "(6)" in err and "Fix: make --per_device_train_batch_size" in err


def test_completion_longer_than_max_seq_length(capsys, tmp_path):
    err = _err(capsys, ["--max_completion_length", "600", "--max_seq_length", "512"], tmp_path)
    assert "--max_completion_length 600 leaves no room for the prompt in --max_seq_length 512" in err


def test_resume_without_checkpoint(capsys, tmp_path):
    err = _err(capsys, ["--resume"], tmp_path)
    assert "--resume: no complete checkpoint" in err
