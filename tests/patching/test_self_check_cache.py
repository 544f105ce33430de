"""The self-check's verdict cache cannot be forged or turned into a weapon: verdicts are read only from a regular
file of this user's that others cannot write, written through an unpredictable temporary, bounded in size; what is
malformed is ignored with one line (never a traceback); the child process checks this process's TRL."""

from __future__ import annotations

import json
import os
import warnings

import pytest

from slimrl.patching.every_trainer import preflight as self_check


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("SLIMRL_CACHE", str(folder))
    monkeypatch.setattr(self_check, "_CACHE_NOTED", set())
    return folder / "self-check.json"


def _lines(fn):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in seen]


def _write(path, data, mode=0o600):
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    os.chmod(path, mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user's needs root")
def test_a_pass_another_user_wrote_is_not_trusted(cache):
    _write(cache, {"any": {"grpo": {"passed": True, "row": "forged", "seconds": 1}}})
    os.chown(cache, 4242, 4242)
    verdicts, lines = _lines(self_check.cached)
    assert verdicts == {} and any("belongs to another user" in ln for ln in lines)


def test_a_cache_others_can_write_is_not_trusted(cache):
    _write(cache, {"any": {"grpo": {"passed": True, "row": "ok", "seconds": 1}}}, mode=0o666)
    verdicts, lines = _lines(self_check.cached)
    assert verdicts == {} and any("writable by others" in ln for ln in lines)


@pytest.mark.parametrize(
    "content",
    [
        "[1, 2]",
        '"a string"',
        '{"k": ["not", "a", "dict"]}',
        '{"k": {"grpo": 3}}',
        '{"k": {"grpo": {"passed": "no", "row": "x"}}}',
        "{not json",
    ],
)
def test_malformed_content_is_ignored_in_one_line(cache, content, capsys):
    from slimrl.cli import doctor

    _write(cache, content)
    verdicts, lines = _lines(self_check.cached)
    assert verdicts in ({}, {"k": {}}) and len(lines) == 1, (verdicts, lines)
    assert doctor.main([]) in (0, 1) and "Traceback" not in capsys.readouterr().err


def test_a_fifo_or_a_device_is_refused_without_reading(cache):
    os.mkfifo(cache)  # a read would block for ever
    verdicts, lines = _lines(self_check.cached)
    assert verdicts == {} and any("not a regular file" in ln for ln in lines)
    cache.unlink()
    cache.symlink_to("/dev/zero")  # a read would never end
    self_check._CACHE_NOTED.clear()
    verdicts, lines = _lines(self_check.cached)
    assert verdicts == {} and any("not a regular file" in ln for ln in lines)


def test_a_huge_file_is_refused(cache):
    _write(cache, "{" + " " * (self_check.MAX_CACHE_BYTES + 10) + "}")
    verdicts, lines = _lines(self_check.cached)
    assert verdicts == {} and any("not a verdict file" in ln for ln in lines)


def test_writes_go_through_an_unpredictable_temporary(cache, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    planted = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")  # the temporary's name before: predictable
    planted.symlink_to(victim)
    self_check._save("set", {"grpo": {"passed": True, "row": "grpo ok", "seconds": 1.0}})
    assert victim.read_text() == "keep me"
    assert self_check.cached() == {"set": {"grpo": {"passed": True, "row": "grpo ok", "seconds": 1.0}}}
    assert not any(p.name.endswith(".tmp") and p != planted for p in cache.parent.iterdir())


def test_the_child_checks_this_processs_trl(monkeypatch):
    """A script that put its own TRL first: the child must check that one; a child that imported another TRL fails
    every row it was asked for, naming both."""
    import trl

    monkeypatch.setattr(trl, "__file__", "/somewhere/else/trl/__init__.py")
    verdicts = self_check.run_rows(["grpo"])
    assert not verdicts["grpo"]["passed"] and "imported another TRL" in verdicts["grpo"]["row"]


def test_a_cache_folder_that_is_the_users_own_symlink_is_trusted(cache, tmp_path, monkeypatch):
    """Round 7: ``SLIMRL_CACHE`` pointing at the user's own link counted as "writable by others" (a link's mode is
    rwx for all), so the self-check reran every run. The folder it names is judged instead: trusted when it is the
    user's and closed, refused when the folder it names is writable by others."""
    verdict = {"any": {"grpo": {"passed": True, "row": "ok", "seconds": 1}}}
    _write(cache, verdict)
    link = tmp_path / "cache-link"
    link.symlink_to(cache.parent)
    monkeypatch.setenv("SLIMRL_CACHE", str(link))
    verdicts, lines = _lines(self_check.cached)
    assert verdicts == verdict and not lines
    os.chmod(cache.parent, 0o777)
    verdicts, lines = _lines(self_check.cached)
    assert verdicts == {} and any("writable by others" in ln for ln in lines)
