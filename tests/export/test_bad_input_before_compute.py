"""Export input that ended in a raw TypeError, wrote into the current folder, or was checked only after the
export: each one line before anything is computed."""

from __future__ import annotations

import pytest

from slimrl.cli import export as export_cli
from slimrl.export.gguf import ExportError
from tests.export.test_ownership import lora, run  # noqa: F401 - fixtures


@pytest.fixture
def no_load(monkeypatch):
    monkeypatch.setattr(export_cli, "_load", lambda *a, **k: pytest.fail("the model was loaded first"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--output", ""], "--output '': an empty path"),
        (["--push_to_hub", "not a repo!"], "--push_to_hub not a repo!: repo_id='not a repo!': pass 'name' or"),
        (["--push_to_hub", "a/b/c"], "pass 'name' or 'user/name'"),
    ],
)
def test_export_refuses_before_loading(run, no_load, capsys, argv, message):  # noqa: F811
    assert export_cli.main(["--adapter", str(run), "--formats", "lora", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


@pytest.mark.parametrize("folder", [None, 123, ""])
def test_save_lora_names_a_bad_folder(lora, folder):  # noqa: F811
    with pytest.raises(TypeError, match=r"save_lora\(save_directory=.*\): pass the folder to write to"):
        lora.save_lora(folder)


def test_merged_dtype_and_gguf_method_are_checked(lora, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match=r"dtype='float99': pass a floating torch dtype"):
        lora.save_pretrained_merged(tmp_path / "m", dtype="float99")
    with pytest.raises(ExportError, match=r"quantization_method=None: pass a GGUF type name"):
        lora.save_pretrained_gguf(tmp_path / "g", quantization_method=None)
    assert not (tmp_path / "m").exists() and not (tmp_path / "g").exists()
