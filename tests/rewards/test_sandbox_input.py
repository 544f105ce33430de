"""The sandbox's never-raise contract and its limits: a forged answer is a typed
failure, never an exception in the trainer; a limit that cannot run is one line naming it before anything starts."""

from __future__ import annotations

import json
import math

import pytest

from slimrl.rewards.answers import parse_answer
from slimrl.rewards.sandbox_types import BadResultError, Limits


def _answer(message) -> bytes:
    body = json.dumps(message).encode()
    return len(body).to_bytes(8, "big") + body


@pytest.mark.parametrize("failure", [[1], {"a": 1}, 3, 2.5, True])
def test_a_forged_failure_is_a_bad_result_not_an_exception(failure):
    result = parse_answer(_answer({"failure": failure, "message": "x"}), 0, Limits(), "", 0.0, {})
    assert isinstance(result.failure, BadResultError), result


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("wall_s", math.nan, "finite"),
        ("cpu_s", math.inf, "finite"),
        ("cpu_s", -1, "positive"),
        ("memory_mb", 512.5, "whole number of MB"),
        ("file_mb", 0.5, "whole number of MB"),
        ("disk_mb", 0.5, "whole number of MB"),
        ("open_files", 3, ">= 16"),
        ("output_kb", 1.5, "whole number of kB"),
    ],
)
def test_a_limit_that_cannot_run_is_one_line_naming_it(name, value, says):
    with pytest.raises(ValueError, match=rf"Limits\({name}=.*{says}"):
        Limits(**{name: value})


def test_whole_numbers_given_as_floats_are_taken():
    limits = Limits(memory_mb=256.0, disk_mb=32.0)
    assert limits.memory_mb == 256 and isinstance(limits.memory_mb, int) and limits.wall_s == 5.0


def test_isolation_none_warns_once_naming_what_is_not_enforced(monkeypatch):
    from slimrl.rewards import process_sandbox

    monkeypatch.setattr(process_sandbox, "_NONE_WARNED", [])
    with pytest.warns(UserWarning, match=r"isolation='none'.*no namespaces, no read-only view, no seccomp"):
        process_sandbox._check_request("x = 1", None, (), {}, ["math"], "none")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        process_sandbox._check_request("x = 1", None, (), {}, ["math"], "none")  # once per process
