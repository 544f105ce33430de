"""``write_atomically``: the destination holds the old text or the whole new one, never an empty file (a
``slimrl compare --json`` killed right after opening its file used to leave it empty, the old record gone)."""

from __future__ import annotations

import os

import pytest

from slimrl.compat.runtime import atomic_write


def test_the_new_text_replaces_the_old(tmp_path):
    path = tmp_path / "record.json"
    path.write_text("old")
    atomic_write.write_atomically(path, "new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_a_write_stopped_midway_keeps_the_old_record(tmp_path, monkeypatch):
    path = tmp_path / "record.json"
    path.write_text("old")

    def killed(fd):
        raise KeyboardInterrupt  # as a signal arriving between the write and the rename

    monkeypatch.setattr(os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        atomic_write.write_atomically(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["record.json"]
