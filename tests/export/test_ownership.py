"""Exports write only what they own: a re-export clears its own previous files (and only those), a user's file of
the same name is refused in one line unless ``overwrite``, the source adapter's folder is never an output, and a
killed export leaves no converter running and no temporary folder past the next export."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.cli import export as export_cli
from slimrl.export.files import MANIFEST, ExportConflictError, clean_stale
from tests.tiny import tiny_llama, tiny_tokenizer


@pytest.fixture
def lora(tmp_path):
    base = tmp_path / "base"
    tiny_llama().save_pretrained(base)
    tiny_tokenizer().save_pretrained(base)
    model, _ = FastLanguageModel.from_pretrained(str(base), max_seq_length=64)
    model = FastLanguageModel.get_peft_model(model, r=4, init_lora_weights=False, use_gradient_checkpointing=False)
    return model


def _logits(path: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=torch.arange(3, 13)[None]).logits


def test_a_sharded_export_over_a_single_file_one_loads_the_new_weights(lora, tmp_path):
    out = tmp_path / "merged"
    lora.save_pretrained_merged(out)
    assert (out / "model.safetensors").is_file()
    with torch.no_grad():  # train a little: the second export's weights differ from the first's
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.add_(0.05)
    lora.save_pretrained_merged(out, max_shard_size="20KB")
    names = {p.name for p in out.iterdir()}
    assert "model.safetensors" not in names and "model.safetensors.index.json" in names  # the old file is gone
    assert set(json.loads((out / MANIFEST).read_text())["files"]) == names - {MANIFEST}
    fresh = tmp_path / "fresh"
    lora.save_pretrained_merged(fresh)
    torch.testing.assert_close(_logits(out), _logits(fresh))  # transformers loads the new weights


def test_a_users_file_of_the_same_name_is_refused_then_replaced_on_request(lora, tmp_path):
    out = tmp_path / "adapter-out"
    out.mkdir()
    (out / "README.md").write_text("my notes")
    (out / "keep.txt").write_text("unrelated")
    with pytest.raises(ExportConflictError, match="README.md, not written by a slimrl export"):
        lora.save_lora(out)
    assert (out / "README.md").read_text() == "my notes" and not (out / "adapter_config.json").exists()
    lora.save_lora(out, overwrite=True)
    assert (out / "README.md").read_text() != "my notes" and (out / "adapter_config.json").is_file()
    assert (out / "keep.txt").read_text() == "unrelated"  # a file no export writes is never touched


def test_weights_of_another_save_beside_the_export_are_refused(lora, tmp_path):
    out = tmp_path / "merged"
    out.mkdir()
    torch.save({}, out / "pytorch_model.bin")  # a hand-made save: loaders could pick it over the export
    with pytest.raises(ExportConflictError, match="pytorch_model.bin"):
        lora.save_pretrained_merged(out)


@pytest.fixture
def run(lora, tmp_path):
    lora.save_lora(tmp_path / "run" / "adapter")
    return tmp_path / "run"


@pytest.mark.parametrize("where", ["adapter", "adapter/inside", "file", "readme"])
def test_cli_output_folders_that_are_refused_in_one_line(run, capsys, where):
    adapter = run / "adapter"
    before = {p.name: p.read_bytes() for p in adapter.iterdir() if p.is_file()}
    out = {"adapter": adapter, "adapter/inside": adapter / "inside", "file": run / "a-file", "readme": run / "out"}[
        where
    ]
    if where == "file":
        out.write_text("x")
    if where == "readme":
        (out / "lora").mkdir(parents=True)
        (out / "lora" / "README.md").write_text("mine")
    assert export_cli.main(["--adapter", str(run), "--output", str(out), "--formats", "lora"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("slimrl export: error: "), err
    assert {p.name: p.read_bytes() for p in adapter.iterdir() if p.is_file()} == before  # the source unchanged
    if where == "readme":
        assert "--overwrite" in err and (out / "lora" / "README.md").read_text() == "mine"


@pytest.mark.parametrize("damage", ["json", "truncated", "other-base", "no-weights"])
def test_cli_damaged_or_foreign_adapters_are_one_line(run, tmp_path, capsys, damage):
    adapter = run / "adapter"
    if damage == "json":
        (adapter / "adapter_config.json").write_text("{not json")
    elif damage == "truncated":
        data = (adapter / "adapter_model.safetensors").read_bytes()
        (adapter / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    elif damage == "no-weights":
        (adapter / "adapter_model.safetensors").unlink()
    else:
        other = tmp_path / "other-base"
        from transformers import LlamaConfig, LlamaForCausalLM

        LlamaForCausalLM(
            LlamaConfig(
                vocab_size=49,
                hidden_size=48,
                intermediate_size=96,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
            )
        ).save_pretrained(other)
        tiny_tokenizer().save_pretrained(other)
    extra = ["--model", str(tmp_path / "other-base")] if damage == "other-base" else []
    assert export_cli.main(["--adapter", str(run), "--formats", "lora", *extra]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "slimrl export" in ln]  # transformers' bars aside
    assert len(err) == 1 and "--adapter" in err[0] and "Traceback" not in err[0], err


def test_the_default_output_of_a_plain_adapter_folder_is_beside_it(lora, tmp_path, capsys):
    lora.save_lora(tmp_path / "my-adapter")
    before = sorted(p.name for p in (tmp_path / "my-adapter").iterdir())
    assert export_cli.main(["--adapter", str(tmp_path / "my-adapter"), "--formats", "lora"]) == 0
    assert (tmp_path / "my-adapter-export" / "lora" / "adapter_config.json").is_file()
    assert sorted(p.name for p in (tmp_path / "my-adapter").iterdir()) == before


def test_a_killed_export_leaves_no_converter_and_its_folders_go_next_time(tmp_path):
    """The converter dies with the exporting process (parent-death signal); the temporary folders of a process that
    is gone are removed by the next export. The export's temporary folder lives in a folder of this test's own:
    in the shared one, another test's export (another pytest worker) may clean it first."""
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "convert_hf_to_gguf.py").write_text(
        f"import os, time\nopen({str(tmp_path / 'converter.pid')!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n"
    )
    script = f"""
import sys
sys.path.insert(0, {str(fake)!r})
import os
os.environ['PYTHONPATH'] = {str(fake)!r}
from pathlib import Path
from slimrl.export import gguf
from slimrl.export.files import temp_directory
with temp_directory('merged') as tmp:
    gguf.convert(Path(tmp), Path(tmp) / 'out.gguf', 'f16')
"""
    parent = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "TMPDIR": str(own_tmp)})
    pid_file = tmp_path / "converter.pid"
    for _ in range(300):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.1)
    converter = int(pid_file.read_text())
    left = list(own_tmp.glob(f"slimrl-merged-{parent.pid}-*"))
    assert left, "the export's temporary folder carries its process id"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    time.sleep(0.5)
    assert not Path(f"/proc/{converter}").exists() or "Z" in Path(f"/proc/{converter}/stat").read_text().split()[2]
    removed = clean_stale(own_tmp)
    assert all(p in removed for p in left) and not any(p.exists() for p in left)
