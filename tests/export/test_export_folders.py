"""Export folders under hostile conditions, each checked afterwards: an edited file of an earlier export, a
symbolic link where an export folder goes, the adapter as its own output, a LoRA save followed by a merged one, a
re-export failing midway, a user's folder named like a temporary, a full disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slimrl.cli import export as export_cli
from slimrl.export.files import ExportConflictError, ExportWriteError, clean_stale, staged_directory
from tests.export.test_ownership import lora, run  # noqa: F401 - fixtures


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_file_edited_after_an_export_is_refused_next_time(lora, tmp_path):  # noqa: F811
    out = tmp_path / "o"
    lora.save_lora(out)
    (out / "README.md").write_text("my notes")
    with pytest.raises(ExportConflictError, match=r"README\.md, not written by a slimrl export"):
        lora.save_lora(out)
    assert (out / "README.md").read_text() == "my notes"
    lora.save_lora(out, overwrite=True)
    assert (out / "README.md").read_text() != "my notes"


@pytest.mark.parametrize("fmt", ["lora", "merged_16bit"])
def test_a_link_where_an_export_folder_goes_is_refused(run, tmp_path, capsys, fmt):  # noqa: F811
    """(b, c) O/lora or O/merged_16bit a symbolic link to the adapter: the export would rewrite the adapter."""
    adapter = run / "adapter"
    before = _files(adapter)
    out = tmp_path / "O"
    out.mkdir()
    (out / fmt).symlink_to(adapter)
    for extra in ([], ["--overwrite"]):
        assert export_cli.main(["--adapter", str(run), "--output", str(out), "--formats", fmt, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "adapter" in err, err
    assert _files(adapter) == before


def test_an_adapter_exported_onto_itself_is_refused(run, capsys):  # noqa: F811
    """(d) the adapter at run/lora, --output run --formats lora: run/lora is the adapter."""
    os.rename(run / "adapter", run / "lora")
    before = _files(run / "lora")
    assert export_cli.main(["--adapter", str(run / "lora"), "--output", str(run), "--formats", "lora"]) == 2
    assert "is the adapter folder" in capsys.readouterr().err
    assert _files(run / "lora") == before


def test_a_merged_save_into_a_lora_save_is_refused(lora, tmp_path):  # noqa: F811
    """(e) save_lora(d) then save_pretrained_merged(d): the adapter files were removed silently."""
    d = tmp_path / "d"
    lora.save_lora(d)
    before = _files(d)
    with pytest.raises(ExportConflictError, match=r"holds a lora export; a merged_16bit export there would remove"):
        lora.save_pretrained_merged(d)
    assert _files(d) == before


def test_a_re_export_failing_midway_leaves_the_folder_as_it_was(lora, tmp_path):  # noqa: F811
    """(f) a folder where tokenizer.json goes: one line, and the old export untouched (no new adapter_config.json
    beside the old manifest)."""
    out = tmp_path / "o"
    lora.save_lora(out)
    (out / "tokenizer.json").unlink()
    (out / "tokenizer.json").mkdir()
    before = _files(out)
    with pytest.raises(ExportConflictError, match=r"tokenizer\.json is a folder or a link where the export writes"):
        lora.save_lora(out, overwrite=True)
    assert _files(out) == before


def test_a_move_failing_midway_puts_everything_back(tmp_path, monkeypatch):
    out = tmp_path / "o"
    with staged_directory(out, kind="lora") as stage:
        for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json"):
            (stage / name).write_text(f"old {name}")
    before = _files(out)
    real = os.replace
    calls = []

    def failing(src, dst):
        calls.append(dst)
        if str(dst).endswith("tokenizer.json") and ".partial-" in str(src):
            raise OSError(5, "injected I/O error")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="injected"):
        with staged_directory(out, kind="lora") as stage:
            for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json"):
                (stage / name).write_text(f"new {name}")
    monkeypatch.setattr(os, "replace", real)
    assert _files(out) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".o.") and not p.name.endswith(".export-lock")]


def test_a_users_folder_named_like_a_temporary_is_never_removed(tmp_path):
    """(g) '.notes.partial-999999-mine' and a staging-shaped name without slimrl's marker stay."""
    mine = [
        tmp_path / ".notes.partial-999999-mine",
        tmp_path / ".notes.partial-999999-abcd1234",
        tmp_path / "slimrl-merged-999999-mine",
    ]
    for folder in mine:
        folder.mkdir()
        (folder / "keep.txt").write_text("x")
    clean_stale(tmp_path)
    assert all((folder / "keep.txt").is_file() for folder in mine)


def test_a_full_disk_is_one_line_and_changes_nothing(tmp_path):
    """(h) a full disk while writing (safetensors reports it in its own words): an ExportWriteError, one line."""
    out = tmp_path / "o"
    with pytest.raises(ExportWriteError, match=r"no space left on the device.*nothing was changed") as err:
        with staged_directory(out, kind="merged_16bit"):
            raise RuntimeError(
                'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No '
                'space left on device" })'
            )
    assert "\n" not in str(err.value) and not out.exists()
