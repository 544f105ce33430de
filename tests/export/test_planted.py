"""Exports that no one else's file can steer: backup folders planted by another user (in ``$TMPDIR`` or in a shared
output folder), a lock file that is a link or another user's, journals that do not parse or name paths outside the
output folder. Each case is checked afterwards: the user's files as they were, one line where something was refused
or set aside. "Another user" is a real other uid (the files are given to ``nobody``), so these run as root (CI does);
elsewhere they skip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

from slimrl.export.files import ExportConflictError, clean_stale, staged_directory
from slimrl.export.journal import NEW, PLACING, STAGE_MARK, fingerprint

OTHER_UID = 65534  # nobody
OLD = {"adapter_config.json": "old config", "adapter_model.safetensors": "old weights"}
NEW_FILES = {"adapter_config.json": "new config", "adapter_model.safetensors": "new weights"}
as_root = pytest.mark.skipif(os.getuid() != 0, reason="giving files to another uid needs root")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _give_away(path: Path) -> None:
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.lchown(Path(root) / name, OTHER_UID, OTHER_UID)
    os.lchown(path, OTHER_UID, OTHER_UID)


def _plant(place: Path, target_name: str, journal: str, files: dict[str, str]) -> Path:
    """A folder shaped as a killed swap's backup of ``place / target_name``, with ``journal`` as its journal."""
    backup = place / f".{target_name}.backup-{_dead_pid()}-abcd1234"
    backup.mkdir(mode=0o700)
    (backup / STAGE_MARK).touch()
    (backup / PLACING).touch()
    (backup / NEW).write_text(journal)
    for name, text in files.items():
        (backup / name).write_text(text)
    return backup


def _export(folder: Path, files: dict[str, str]) -> None:
    with staged_directory(folder, kind="lora") as stage:
        for name, text in files.items():
            (stage / name).write_text(text)


def _contents(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """``$TMPDIR`` for this test: the folder the export's clean-up scans besides the output's parent."""
    folder = tmp_path / "tmp"
    folder.mkdir(mode=0o1777)
    os.chmod(folder, 0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@as_root
def test_another_users_backup_in_tmpdir_deletes_nothing(tmp_path, own_tmp):
    precious = own_tmp / "precious.txt"
    precious.write_text("the user's own file")
    (own_tmp / "victim").mkdir()
    plant = _plant(own_tmp, "victim", json.dumps({"files": {"../precious.txt": fingerprint(precious)}}), {})
    _give_away(plant)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # another user's folder is not even named: it is not this user's concern
        _export(tmp_path / "out", NEW_FILES)
    assert precious.read_text() == "the user's own file"
    assert plant.is_dir()  # not this user's to remove


@as_root
def test_another_users_backup_beside_the_output_is_not_restored(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    out = shared / "out"
    _export(out, OLD)
    plant = _plant(shared, "out", json.dumps({"files": {}}), {"adapter_model.safetensors": "another user's adapter"})
    _give_away(plant)
    assert clean_stale(shared) == []  # what the next export does first
    assert _contents(out) == OLD
    _export(out, NEW_FILES)
    assert _contents(out) == NEW_FILES


def test_a_journal_naming_a_path_outside_the_output_is_set_aside(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("the user's own file")
    (tmp_path / "out").mkdir()
    for rel in ("../precious.txt", str(precious)):
        plant = _plant(tmp_path, "out", json.dumps({"files": {rel: fingerprint(precious)}}), {})
        with pytest.warns(UserWarning, match=r"was not used: its journal names .* not inside") as seen:
            assert clean_stale(tmp_path) == []
        assert len(seen) == 1 and "\n" not in str(seen[0].message)
        assert precious.read_text() == "the user's own file" and not plant.exists()
        assert plant.with_name(plant.name.replace(".backup-", ".set-aside-")).is_dir()


@pytest.mark.parametrize("journal", ['"ab"', "5", "[1, 2]", "{not json"])
def test_a_journal_that_does_not_parse_deletes_nothing_and_is_set_aside(tmp_path, journal):
    """``"ab"`` as a list of names would be ``a`` and ``b``; ``5`` made every later export a ``TypeError``."""
    lora = tmp_path / "lora"
    _export(lora, {"a": "mine", "b": "mine too"})
    _plant(tmp_path, "lora", journal, {})
    with pytest.warns(UserWarning, match=r"lora was not used: its journal .* nothing was deleted or restored") as seen:
        clean_stale(tmp_path)
    assert len(seen) == 1 and "\n" not in str(seen[0].message)
    assert _contents(lora) == {"a": "mine", "b": "mine too"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # set aside once: the next exports neither warn again nor fail
        _export(lora, {"a": "new", "b": "new too"})
        _export(lora, {"a": "newer", "b": "newer too"})
    assert _contents(lora) == {"a": "newer", "b": "newer too"}


def test_a_file_changed_since_the_swap_placed_it_stays(tmp_path):
    """A killed swap's repair removes a file it placed only while that file is still the one it placed."""
    out = tmp_path / "out"
    _export(out, OLD)
    (out / "extra.json").write_text("the user's, written after the kill")
    _plant(tmp_path, "out", json.dumps({"files": {"extra.json": [1, 1]}}), {})
    assert clean_stale(tmp_path)
    assert (out / "extra.json").read_text() == "the user's, written after the kill"


def test_a_lock_file_that_is_a_link_or_a_hard_link_is_refused(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("the user's own file")
    out = tmp_path / "out"
    lock = tmp_path / ".out.export-lock"
    for make in (lock.symlink_to, lambda p: os.link(p, lock)):
        make(precious)
        with pytest.raises(ExportConflictError, match=r"lock file .* remove it or choose another output folder") as e:
            _export(out, NEW_FILES)
        assert "\n" not in str(e.value)
        assert precious.read_text() == "the user's own file" and not out.exists()
        lock.unlink()
    _export(out, NEW_FILES)  # the lock file the export makes itself
    assert _contents(out) == NEW_FILES


@as_root
def test_another_users_lock_file_is_refused(tmp_path):
    lock = tmp_path / ".out.export-lock"
    lock.write_text("")
    os.chmod(lock, 0o666)
    _give_away(lock)
    with pytest.raises(ExportConflictError, match=r"not a file of yours alone \(owner uid 65534"):
        _export(tmp_path / "out", NEW_FILES)
    assert lock.read_text() == ""
