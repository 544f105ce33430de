"""glibc malloc tuning: applied on Linux by default, and switchable off (its memory effect is in bench/)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = "from slimrl.compat.runtime.malloc import tune_malloc; print(tune_malloc())"


def _applied(env_value: str) -> str:
    env = dict(os.environ, SLIMRL_MALLOC_TUNING=env_value)
    return subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_tuning_applies_and_can_be_turned_off():
    assert _applied("1") == str(1 << 20)
    assert _applied("0") == "None"


RESTART = """
import os, sys
print("start", os.getpid(), flush=True)
from slimrl.compat.runtime.malloc import restart_with_huge_pages
restart_with_huge_pages()
print("tunables", os.environ.get("GLIBC_TUNABLES"), sys.argv[1:], os.getpid())
"""

FAULTS = """
import ctypes, resource, torch
ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # slimrl's threshold for the gradient passes
x = torch.randn(8, 542, 1536)  # one MLP activation of the GRPO bench
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    y = x * 2.0
    del y
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def _huge_pages_possible() -> bool:
    from slimrl.compat.runtime.malloc import huge_pages_possible

    return huge_pages_possible()


@pytest.mark.slow
@pytest.mark.skipif(not _huge_pages_possible(), reason="needs glibc >= 2.35 and transparent huge pages")
def test_restart_once_with_huge_pages_and_fewer_page_faults():
    """``slimrl train``'s restart: same process id and arguments, the tunable set once (no loop), kept tunables;
    and what it buys: an allocation of a 26 MiB activation page-faults in 2 MiB pages (counted, not timed)."""
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.arena_max=4")
    env.pop("SLIMRL_MALLOC_TUNING", None)
    out = subprocess.run(
        [sys.executable, "-c", RESTART, "x", "--y"], capture_output=True, text=True, env=env, check=True
    ).stdout.split("\n")
    starts = [ln for ln in out if ln.startswith("start")]
    assert len(starts) == 2 and starts[0] == starts[1]  # restarted once, in place
    pid = starts[0].split()[1]
    assert out[2] == f"tunables glibc.malloc.arena_max=4:glibc.malloc.hugetlb=1 ['x', '--y'] {pid}"
    off = subprocess.run(
        [sys.executable, "-c", RESTART],
        capture_output=True,
        text=True,
        check=True,
        env=dict(env, SLIMRL_MALLOC_TUNING="0"),
    ).stdout
    assert off.count("start") == 1 and "tunables glibc.malloc.arena_max=4 " in off

    def faults(tunables: str) -> int:
        run = subprocess.run(
            [sys.executable, "-c", FAULTS],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, GLIBC_TUNABLES=tunables),
        )
        return int(run.stdout.strip())

    small, huge = faults("glibc.malloc.arena_max=8"), faults("glibc.malloc.hugetlb=1")
    assert huge * 3 < small, (small, huge)
