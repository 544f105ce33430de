"""Reading a child process's pipes from the trainer: every pipe drained at once until all are closed or a deadline
passes, each with a size cap (past it the read stops and the call is over) and a tail kept (what the result shows).
A child cannot block the reader: the pipes are the trainer's and are read without blocking."""

from __future__ import annotations

import os
import selectors
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Channels:
    """What :func:`read_channels` read: the bytes kept per pipe, which pipes passed their cap, whether the deadline
    passed first."""

    data: dict[str, bytes] = field(default_factory=dict)
    over: dict[str, bool] = field(default_factory=dict)
    timed_out: bool = False


def read_channels(
    fds: dict[str, int],
    deadline: float,
    caps: dict[str, int],
    keep: dict[str, int],
    until: Callable[[Channels], bool] | None = None,
) -> Channels:
    """Read ``fds`` (name -> descriptor) until every one is at end of file, ``until(read so far)`` holds, the
    ``time.perf_counter()`` deadline passes, or one passes its cap in ``caps`` (bytes read in all). Of each pipe the
    last ``keep[name]`` bytes are kept (all of it when the name is not in ``keep``)."""
    got = Channels(data={n: b"" for n in fds}, over={n: False for n in fds})
    total = {n: 0 for n in fds}
    sel = selectors.DefaultSelector()
    for name, fd in fds.items():
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ, name)
    try:
        while sel.get_map():
            left = deadline - time.perf_counter()
            if left <= 0:
                got.timed_out = True
                break
            for key, _ in sel.select(timeout=min(left, 0.5)):
                name = key.data
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                total[name] += len(chunk)
                got.data[name] = (got.data[name] + chunk)[-keep[name] :] if name in keep else got.data[name] + chunk
                if total[name] > caps[name]:
                    got.over[name] = True
                    return got
                if until is not None and until(got):
                    return got
    finally:
        sel.close()
    return got
