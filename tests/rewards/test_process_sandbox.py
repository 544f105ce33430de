"""The reward sandbox (:mod:`slimrl.rewards.process_sandbox`): values and the code's own errors come back as data,
and each adversarial case is contained and reported with its typed failure — an infinite loop, a sleeping loop, a
fork bomb, a memory hog, writing outside the scratch directory, reading the trainer's files, opening a socket,
importing ``os``/``subprocess``/``ctypes``/``socket`` through tricks (``__import__``, the builtins dict,
``importlib``, a loader found among ``object``'s subclasses), calling into ``ctypes`` already loaded, and killing
the parent. Bad arguments are refused before a process starts."""

from __future__ import annotations

import os
import time

import pytest

from slimrl.rewards import process_sandbox as sb
from slimrl.rewards.process_sandbox import Limits, run_sandboxed

FAST = Limits(wall_s=10, cpu_s=2, memory_mb=256)

SUBCLASS = (
    "def find(name):\n    todo, seen = list(().__class__.__base__.__subclasses__()), set()\n"
    "    while todo:\n        c = todo.pop()\n        if c.__name__ == name:\n            return c\n"
    "        if c not in seen:\n            seen.add(c)\n            todo.extend(type.__subclasses__(c))\n"
    "    raise LookupError(name)\n"
)


def test_a_value_comes_back_as_json_data():
    from slimrl import SandboxLimits
    from slimrl import run_sandboxed as exported

    assert exported is run_sandboxed and SandboxLimits is Limits
    got = run_sandboxed(
        "def solve(xs, reverse=False):\n    import heapq\n    return sorted(xs, reverse=reverse)\n",
        call="solve",
        args=[[3, 1, 2]],
        kwargs={"reverse": True},
        limits=FAST,
    )
    assert got.ok and got.value == [3, 2, 1] and got.unwrap() == [3, 2, 1]
    assert "audit hook" in got.isolation and "resource limits" in got.isolation


def test_output_is_captured_and_the_scratch_directory_is_writable():
    code = (
        "def f():\n    with open('notes.txt', 'w') as fh:\n        fh.write('kept')\n"
        "    print('hello')\n    return open('notes.txt').read()\n"
    )
    got = run_sandboxed(code, call="f", limits=FAST)
    assert got.value == "kept" and got.stdout == "hello\n"


@pytest.mark.parametrize(
    "code,call,kind,detail",
    [
        ("def f():\n    return 1 / 0\n", "f", sb.RaisedError, "division by zero"),
        ("x = 1\n", "f", sb.RaisedError, "defines no function 'f'"),
        ("def f():\n    return {1, 2}\n", "f", sb.BadResultError, "not JSON data: set"),
        ("def f(:\n", "f", sb.RaisedError, "SyntaxError"),
    ],
)
def test_the_codes_own_failures_are_typed(code, call, kind, detail):
    got = run_sandboxed(code, call=call, limits=FAST)
    assert isinstance(got.failure, kind) and detail in f"{got.failure} {getattr(got.failure, 'error_type', '')}"
    with pytest.raises(kind):
        got.unwrap()


def _contained(code: str, kind: type, detail: str, limits: Limits = FAST, call: str | None = "f"):
    started = time.perf_counter()
    got = run_sandboxed(code, call=call, limits=limits)
    assert isinstance(got.failure, kind), (got.failure, got.stderr[-500:])
    assert detail in str(got.failure), str(got.failure)
    assert time.perf_counter() - started < limits.wall_s + 5  # the trainer got its answer
    return got


def test_an_infinite_loop_hits_the_cpu_limit():
    _contained(
        "def f():\n    while True:\n        pass\n",
        sb.TimeLimitError,
        "CPU-time limit",
        Limits(wall_s=20, cpu_s=1, memory_mb=256),
    )


def test_a_sleeping_loop_hits_the_wall_clock_limit():
    _contained(
        "def f():\n    import time\n    while True:\n        time.sleep(1)\n",
        sb.TimeLimitError,
        "wall-clock limit",
        Limits(wall_s=1.5, cpu_s=5, memory_mb=256),
    )


def test_a_memory_hog_hits_the_memory_limit():
    _contained(
        "def f():\n    hog = []\n    while True:\n        hog.append(bytearray(50 * 2**20))\n",
        sb.MemoryLimitError,
        "memory",
        Limits(wall_s=10, cpu_s=5, memory_mb=200),
    )


def test_a_fork_bomb_is_stopped_at_its_first_fork():
    code = SUBCLASS + (
        "def f():\n    fork = find('_wrap_close').__init__.__globals__['fork']\n    while True:\n        fork()\n"
    )
    _contained(code, sb.ForbiddenError, "os.fork")


@pytest.mark.parametrize("how", ["open", "os.open through random's os", "os.rename"])
def test_writing_outside_the_scratch_directory_is_refused(tmp_path, how):
    target = tmp_path / "escaped.txt"
    body = {
        "open": f"    open({str(target)!r}, 'w').write('x')\n",
        "os.open through random's os": f"    import random\n    random._os.open({str(target)!r}, 0o101)\n",
        "os.rename": f"    import random\n    open('a', 'w').close()\n    random._os.rename('a', {str(target)!r})\n",
    }
    _contained("def f():\n" + body[how], sb.ForbiddenError, "outside the scratch directory")
    assert not target.exists()


def test_reading_the_trainers_files_is_refused(tmp_path):
    secret = tmp_path / "checkpoint.txt"
    secret.write_text("the trainer's data")
    got = _contained(f"def f():\n    return open({str(secret)!r}).read()\n", sb.ForbiddenError, "reading")
    assert "the trainer's data" not in got.stdout + got.stderr


def test_listing_the_trainers_directory_is_refused(tmp_path):
    _contained(
        f"def f():\n    import random\n    return random._os.listdir({str(tmp_path)!r})\n",
        sb.ForbiddenError,
        "os.listdir",
    )


@pytest.mark.parametrize(
    "code,kind,detail",
    [
        ("import os\ndef f():\n    return os.getcwd()\n", sb.DisallowedImportError, "imports os"),
        ("def f():\n    return __import__('subprocess').run(['true'])\n", sb.DisallowedImportError, "'subprocess'"),
        ("def f():\n    return __builtins__['__import__']('ctypes')\n", sb.DisallowedImportError, "'ctypes'"),
        ("def f():\n    return __import__('importlib').import_module('os')\n", sb.DisallowedImportError, "'importlib'"),
        ("def f():\n    return getattr(__builtins__, '__import__')('os')\n", sb.RaisedError, "no attribute"),
    ],
    ids=["import os", "__import__", "builtins dict", "importlib", "getattr builtins"],
)
def test_imports_through_tricks_are_refused(code, kind, detail):
    _contained(code, kind, detail)


def test_a_socket_module_loaded_by_hand_is_refused():
    """``_socket`` loaded from its file with a loader found among ``object``'s subclasses (no import statement):
    loading a module outside the allow-list is refused by the audit hook."""
    code = SUBCLASS + (
        "def f():\n    spec = find('PathFinder').find_spec('_socket')\n"
        "    module = spec.loader.create_module(spec)\n"
        "    return module.socket(2, 1).connect(('127.0.0.1', 9))\n"
    )
    _contained(code, sb.ForbiddenError, "socket")


def test_ctypes_loaded_by_the_runner_cannot_be_called():
    code = SUBCLASS + "def f():\n    return find('CDLL')(None).getpid()\n"
    _contained(code, sb.ForbiddenError, "ctypes.dlopen")


def test_killing_the_parent_is_refused():
    code = "def f():\n    import random\n    random._os.kill(random._os.getppid(), 9)\n"
    _contained(code, sb.ForbiddenError, "os.kill")
    assert os.getpid()  # still here


def test_frames_of_the_runner_are_out_of_reach():
    code = (
        "def f():\n    try:\n        1 / 0\n    except ZeroDivisionError as err:\n"
        "        return str(err.__traceback__.tb_frame.f_back)\n"
    )
    _contained(code, sb.RaisedError, "object.__getattr__ is not allowed")


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(code=b"def f(): pass"), TypeError, "pass the Python source as a str"),
        (dict(code="def f(): pass", call="f()"), ValueError, "the name of a function"),
        (dict(code="def f(x): pass", call="f", args=[object()]), TypeError, "must be JSON data"),
        (dict(code="def f(): pass", allow="math"), TypeError, "a collection of module names"),
    ],
)
def test_bad_arguments_are_refused_before_a_process_starts(monkeypatch, kwargs, error, match):
    monkeypatch.setattr(sb.subprocess, "Popen", None)  # a process start would fail differently
    with pytest.raises(error, match=match):
        run_sandboxed(**kwargs)


@pytest.mark.parametrize(
    "field,value,match", [("wall_s", 0, "positive"), ("memory_mb", 10, ">= 64"), ("cpu_s", True, "positive")]
)
def test_limits_are_checked(field, value, match):
    with pytest.raises(ValueError, match=f"Limits\\({field}=.*{match}"):
        Limits(**{field: value})
