"""`slimrl train --algorithm X` for the offline trainers and RLOO, on a tiny model and a local dataset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slimrl import unpatch
from slimrl.cli import train
from tests.tiny import tiny_llama, tiny_tokenizer

ROWS = {
    "paired": lambda a: {"prompt": f"{a}+1=", "chosen": str(a + 1), "rejected": str(a + 2)},
    "unpaired": lambda a: {"prompt": f"{a}+1=", "completion": str(a + 1 + a % 2), "label": a % 2 == 0},
    "sft": lambda a: {"prompt": f"{a}+1=", "completion": str(a + 1)},
    "online": lambda a: {"prompt": f"{a}+1="},
}
KIND = {"dpo": "paired", "orpo": "paired", "cpo": "paired", "kto": "unpaired", "sft": "sft", "rloo": "online"}


@pytest.fixture
def model_dir(tmp_path):
    tiny_llama().save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")
    return tmp_path


def _data(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind}.jsonl"
    path.write_text("\n".join(json.dumps(ROWS[kind](a)) for a in range(16)))
    return path


def _argv(tmp_path: Path, algorithm: str) -> list[str]:
    argv = [
        "--algorithm",
        algorithm,
        "--model",
        str(tmp_path / "model"),
        "--dataset",
        str(_data(tmp_path, KIND[algorithm])),
        "--max_steps",
        "2",
        "--save_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--max_seq_length",
        "64",
        "--learning_rate",
        "0.01",
        "--use_gradient_checkpointing",
        "false",
        "--output_dir",
        str(tmp_path / algorithm),
        "--disable_tqdm",
        "true",
    ]
    if algorithm == "rloo":
        argv += [
            "--reward",
            "tests.cli.rewards:digits",
            "--num_generations",
            "4",
            "--max_completion_length",
            "6",
            "--eval_size",
            "4",
            "--eval_max_new_tokens",
            "4",
        ]
    else:
        argv += ["--max_length", "32"]
    return argv


@pytest.mark.parametrize("algorithm", sorted(KIND))
def test_each_algorithm_trains_and_saves(model_dir, capsys, algorithm):
    try:
        assert train.main(_argv(model_dir, algorithm)) == 0
    finally:
        unpatch()
    out = model_dir / algorithm
    stdout = capsys.readouterr().out
    assert "slimrl train: summary" in stdout and "algorithm" in stdout and algorithm in stdout
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all("loss" in r for r in rows)
    assert (out / "metrics.png").is_file()


def test_algorithm_from_yaml_picks_its_config(model_dir, capsys, tmp_path):
    cfg = tmp_path / "kto.yaml"
    cfg.write_text("algorithm: kto\ndesirable_weight: 1.5\n")
    targs, config = train.parse(["--config", str(cfg)])
    assert targs.algorithm == "kto" and type(config).__name__ == "KTOConfig" and config.desirable_weight == 1.5
    assert config.output_dir == "outputs/slimrl-kto"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--algorithm", "dpoo"], "--algorithm dpoo: did you mean dpo?"),
        (
            ["--algorithm", "dpo", "--reward", "tests.cli.rewards:digits"],
            "--reward: --algorithm dpo learns from its dataset",
        ),
        (
            ["--algorithm", "dpo", "--max_length", "600", "--max_seq_length", "512"],
            "--max_length 600 is over --max_seq_length 512",
        ),
    ],
)
def test_algorithm_bad_input(capsys, tmp_path, argv, expected):
    assert train.main(["--output_dir", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and err.count("\n") == 0, err


def test_dataset_without_the_algorithm_columns(capsys, tmp_path):
    data = _data(tmp_path, "sft")
    assert train.main(["--algorithm", "dpo", "--dataset", str(data), "--output_dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"--dataset {data} has columns (prompt, completion) but DPOTrainer reads ('chosen', 'rejected')" in err
    assert "(--algorithm dpo)" in err and err.count("\n") == 1


def test_dataset_columns_follow_trls_rules(model_dir, capsys):
    """One column rule set (the trainer's, in slimrl.patching.every_trainer.validation): an SFT dataset with a 'text'
    column is accepted (the CLI does not demand prompt + completion)."""
    data = model_dir / "text.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"{a}+1={a + 1}"}) for a in range(16)))
    argv = _argv(model_dir, "sft")
    argv[argv.index("--dataset") + 1] = str(data)
    try:
        assert train.main(argv) == 0
    finally:
        unpatch()
