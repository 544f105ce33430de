"""The code-running reward helpers of Unsloth's gpt-oss notebook (slimrl.rewards.sandbox): each guard must stop
the shortcut it is for (a third-party import, a read of the caller's globals, an endless loop) and let honest code
through."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from slimrl import check_python_modules, create_locked_down_function, execute_with_time_limit

SECRET = "the grader's answer"


def test_check_python_modules_names_what_is_imported():
    ok, info = check_python_modules("def f():\n    import math, os.path\n    from typing import Callable\n")
    assert ok and info == {"stdlib": ["math", "os", "typing"], "non_stdlib": [], "relative_imports": 0}
    ok, info = check_python_modules("def f():\n    from numpy import matmul\n    import torch.nn\n")
    assert not ok and info["non_stdlib"] == ["numpy", "torch"]
    ok, info = check_python_modules("from . import grader\n")
    assert not ok and info["relative_imports"] == 1
    ok, info = check_python_modules("def a")
    assert not ok and info["error"].startswith("SyntaxError")


def test_locked_down_function_sees_no_globals_but_runs_honest_code():
    add = create_locked_down_function(
        "def add(a, b):\n    def adder(a):\n        return a + b\n    return adder(b) + b\n"
    )
    assert add(10, 20) == 60
    uses_builtins = create_locked_down_function(
        "def f(xs, k=2):\n    import math\n    return sorted(xs)[:k], math.floor(2.5)\n"
    )
    assert uses_builtins([3, 1, 2]) == ([1, 2], 2)
    cheat = create_locked_down_function("def peek():\n    return SECRET\n")
    with pytest.raises(NameError, match="SECRET"):  # this module's SECRET exists; the function's process has none
        cheat()
    assert "reward sandbox" in repr(cheat)


def test_unsloths_helpers_run_on_the_sandboxs_isolation(tmp_path):
    """What Unsloth's in-process helpers allowed and these do not: reading any file, the caller's globals, catching
    the time limit, a limit that fires seconds late on a loop in C code (and the process is gone after)."""
    from slimrl.rewards.process_sandbox import isolation_report

    if not isolation_report()["ok"]:
        pytest.skip("no kernel isolation here")
    secret = tmp_path / "grader.txt"
    secret.write_text("GRADER")
    read = create_locked_down_function(f"def read():\n    return open({str(secret)!r}).read()\n")
    with pytest.raises(Exception) as caught:
        read()
    assert "GRADER" not in str(caught.value)
    catcher = create_locked_down_function(
        "def spin():\n    while True:\n        try:\n"
        "            sum(range(10 ** 9))\n        except BaseException:\n"
        "            pass\n"
    )

    @execute_with_time_limit(0.5)
    def play():
        return catcher()

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        play()
    assert time.monotonic() - started < 2.0  # C-level loop: in process, the alarm waited for it (7-10 s seen)
    assert catcher._session._proc is None  # the function's process was ended, not left spinning


@pytest.mark.parametrize(
    "code", ["x = 1\ndef f():\n    return x\n", "def f():\n    pass\ndef g():\n    pass\n", "print('side effect')\n"]
)
def test_locked_down_function_takes_exactly_one_function(code, capsys):
    with pytest.raises(ValueError, match="exactly one top-level function"):
        create_locked_down_function(code)
    assert "side effect" not in capsys.readouterr().out  # refused before anything ran


def test_time_limit_stops_an_endless_loop_and_returns_otherwise():
    @execute_with_time_limit(0.3)
    def spin(n):
        while n > 0:
            n += 1

    start = time.monotonic()
    with pytest.raises(TimeoutError, match="Timed out after 0.3s"):
        spin(1)
    assert time.monotonic() - start < 5
    assert execute_with_time_limit(2)(lambda a, b=1: a + b)(1, b=2) == 3
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0, "the timer must be disarmed afterwards"
    with pytest.raises(ZeroDivisionError):
        execute_with_time_limit(2)(lambda: 1 / 0)()
    with pytest.raises(ValueError, match="positive number of seconds"):
        execute_with_time_limit(0)


def test_an_outer_time_limit_keeps_its_earlier_deadline():
    @execute_with_time_limit(0.4)
    def outer():
        execute_with_time_limit(5)(lambda: time.sleep(0.05))()  # an inner limit that ends first
        while True:
            pass

    start = time.monotonic()
    with pytest.raises(TimeoutError, match="0.4s"):
        outer()
    assert time.monotonic() - start < 3


def test_time_limit_off_the_main_thread():
    seen = {}

    def worker():
        try:
            execute_with_time_limit(0.3)(lambda: [None for _ in iter(int, 1)])()
        except TimeoutError as err:
            seen["error"] = err
        seen["value"] = execute_with_time_limit(2)(lambda: 42)()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(10)
    assert isinstance(seen.get("error"), TimeoutError) and seen["value"] == 42
