"""A re-export killed at any point of its swap leaves, after the next export's clean-up (or ``clean_stale``), the
old export or the new one — never a mix — and the backup holding the old files is used, not deleted; a checkpoint's
export is out of the rotation's way; two exports into one folder: the second refuses in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slimrl.export.files import ExportConflictError, clean_stale, staged_directory

OLD = {"adapter_config.json": "old config", "adapter_model.safetensors": "old weights", "stale.txt": "old only"}
NEW = {"adapter_config.json": "new config", "adapter_model.safetensors": "new weights", "extra.json": "new only"}
KILLER = """
import os, signal, sys
from pathlib import Path
from slimrl.export.files import staged_directory
out, at = Path(sys.argv[1]), int(sys.argv[2])
real, count = os.replace, [0]
def replace(src, dst):
    count[0] += 1
    if count[0] == at:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst)
os.replace = replace
with staged_directory(out, kind="lora") as stage:
    for name, text in {new!r}.items():
        (stage / name).write_text(text)
print("finished")
"""


def _contents(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


def _export(folder: Path, files: dict[str, str]) -> None:
    with staged_directory(folder, kind="lora") as stage:
        for name, text in files.items():
            (stage / name).write_text(text)


@pytest.mark.parametrize("at", range(1, 9))
def test_a_swap_killed_anywhere_comes_back_old_or_new(tmp_path, at):
    out = tmp_path / "export"
    _export(out, OLD)
    old = _contents(out)
    proc = subprocess.run(
        [sys.executable, "-c", KILLER.replace("{new!r}", repr(NEW)), str(out), str(at)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )
    clean_stale(out.parent)  # what the next export does first
    after = _contents(out)
    assert after in (old, NEW), (at, proc.stdout, after)
    assert not [p for p in tmp_path.iterdir() if ".backup-" in p.name or ".partial-" in p.name]
    _export(out, NEW)  # and the folder takes the next export as usual
    assert {k: v for k, v in _contents(out).items() if k in NEW} == NEW


def test_two_exports_into_one_folder_the_second_refuses(tmp_path):
    out = tmp_path / "export"
    with staged_directory(out, kind="lora") as stage:
        (stage / "a.json").write_text("first")
        with pytest.raises(ExportConflictError, match="another export is writing there now") as err:
            with staged_directory(out, kind="lora"):
                pass
        assert "\n" not in str(err.value)
    assert (out / "a.json").read_text() == "first"


def test_a_checkpoints_export_is_out_of_the_rotations_way(tmp_path):
    from argparse import Namespace

    from slimrl.cli.export import output_folder

    run = tmp_path / "run"
    (run / "checkpoint-4").mkdir(parents=True)
    out = output_folder(Namespace(output=None), run / "checkpoint-4")
    assert out == run / "exports" / "checkpoint-4"
    assert not out.parent.name.startswith("checkpoint-")  # transformers' rotation globs checkpoint-* in the run
