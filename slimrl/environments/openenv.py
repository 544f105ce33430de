"""OpenEnv environment servers for agentic RL, as Unsloth's OpenEnv notebooks start them.

``from slimrl import launch_openenv, is_port_open`` (Unsloth's names and arguments). An OpenEnv environment is a
FastAPI app served by uvicorn (an OpenEnv checkout's ``envs.<name>.server.app:app``, or one ``openenv init`` made);
its client class (``openenv.core.EnvClient``) talks to it over HTTP and WebSocket. :func:`launch_openenv` returns
``(port, client)``:

* a client passed back in (``openenv_process=``) whose server still answers ``/health`` is returned as it is (a
  notebook re-running its cell keeps its server), and so is a server this process started on ``port``; a server
  this run did not start is never reused (another user's, on a shared machine), one line says the port is taken;
* healthy means ``/health`` answers ``healthy`` (``{"status": "healthy"}`` or the word), not any answer: an
  "unhealthy" server, or a listener that does not speak HTTP, is not; ``timeout`` is a positive number of seconds;
* otherwise a server is started as a child process: ``python -m uvicorn <server>`` in ``working_directory``, on a free
  port of the **loopback interface only** (``127.0.0.1``: Unsloth's binds ``0.0.0.0``, which offers the environment
  to the whole network), with the OpenEnv checkout on ``PYTHONPATH`` (its ``envs/`` at the root and ``src/`` both, as
  OpenEnv's layouts have them) and ``environment`` over this process's environment; its output goes to a log file
  (a pipe nobody reads stops a chatty server);
* the server is slimrl's child for the rest of the run, under a small guard process
  (:mod:`slimrl.environments.server_guard`) that runs it in a process group of its own: when this process exits
  (``atexit``) or is killed (the kernel signals the guard: ``PR_SET_PDEATHSIG`` on Linux, forked from a thread that
  lives as long as the process, so a launch from a worker thread does not end with that thread), the guard sends
  the group ``SIGTERM`` and, 5 s later, ``SIGKILL``: a shutdown hook that hangs, or a process the environment
  started, outlives no run;
* a port that cannot be had, a server that exits or does not answer within ``timeout`` seconds, or a ``/health``
  that is not healthy is one line (``RuntimeError``) naming the server and the last line of its log; a server that
  timed out is ended (killed when it ignores ``SIGTERM``), never left running.

Using the environment in GRPO: TRL's ``environment_factory`` (an object whose methods are tools, with ``reset``) or
``rollout_func``; docs/agentic.md shows both with an OpenEnv client. slimrl's engine generates those rollouts where
``fast_inference=True`` made one.
"""

from __future__ import annotations

import atexit
import functools
import http.client
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from slimrl.compat.runtime.processes import die_with_parent, spawn_for_process
from slimrl.environments import server_guard
from slimrl.environments.server_guard import SHUTDOWN_GRACE

HOST = "127.0.0.1"
_CHILDREN: list[subprocess.Popen] = []


def is_port_open(host: str, port: int) -> bool:
    """Unsloth's ``is_port_open``: whether something accepts TCP connections on ``host:port`` (1 s timeout)."""
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def healthy(base_url: str, timeout: float = 2.0) -> bool:
    """Whether an OpenEnv server at ``base_url`` answers ``GET /health`` with a healthy status."""
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/health", timeout=timeout) as response:  # noqa: S310
            body = response.read(4096)
    except (OSError, ValueError, http.client.HTTPException):  # HTTPException: not HTTP (an SSH banner, ...)
        return False
    try:
        answer = json.loads(body)
    except ValueError:
        return body.strip().lower() == b"healthy"
    status = answer.get("status") if isinstance(answer, dict) else answer
    return isinstance(status, str) and status.strip().lower() == "healthy"


def _base_url(client: Any) -> str | None:
    """The HTTP address of an OpenEnv client's server (clients keep it as ``base_url`` or as their WebSocket URL)."""
    url = getattr(client, "base_url", None) or getattr(client, "_base_url", None) or getattr(client, "_ws_url", None)
    if not url:
        return None
    parts = urllib.parse.urlsplit(str(url))
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return f"{scheme}://{parts.netloc}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _pythonpath(working_directory: Path, inherited: str | None) -> str:
    """The OpenEnv checkout's import roots: the directory itself (``envs/`` at the root) and ``src/`` (the
    ``openenv`` package, or ``envs/`` in older layouts), before whatever was set."""
    roots = [str(working_directory)] + (
        [str(working_directory / "src")] if (working_directory / "src").is_dir() else []
    )
    return os.pathsep.join(roots + ([inherited] if inherited else []))


def _end(child: subprocess.Popen) -> None:
    """SIGTERM to the server's guard, which ends the server's group (module docstring); SIGKILL for a guard that
    has not ended a few seconds after the grace it gives (the kernel then kills the server)."""
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=SHUTDOWN_GRACE + 5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _end_children() -> None:
    for child in _CHILDREN:
        _end(child)


atexit.register(_end_children)


def _last_line(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def launch_openenv(
    port: int = 8111,
    openenv_process: Any = None,
    working_directory: str | None = None,
    server: str = "envs.openspiel_env.server.app:app",
    environment: dict | None = None,
    openenv_class: Any = None,
    timeout: float = 60.0,
) -> tuple[int, Any]:
    """Unsloth's ``launch_openenv``: ``(port, client)`` of a running OpenEnv server (module docstring)."""
    if openenv_class is None or not callable(openenv_class):
        raise ValueError(
            "launch_openenv(openenv_class=...): pass the environment's client class (an OpenEnv "
            "EnvClient subclass, e.g. OpenSpielEnv)"
        )
    if not isinstance(server, str) or ":" not in server:
        raise ValueError(
            f"launch_openenv(server={server!r}): pass the app as 'module.path:attribute', e.g. "
            f"'envs.openspiel_env.server.app:app'"
        )
    if working_directory is None or not Path(working_directory).is_dir():
        raise ValueError(
            f"launch_openenv(working_directory={working_directory!r}): pass the OpenEnv checkout (or "
            f"the folder holding the environment's package)"
        )
    if environment is not None and not isinstance(environment, dict):
        raise ValueError(
            f"launch_openenv(environment={type(environment).__name__}): pass a dict of environment variables"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(
            f"launch_openenv(timeout={timeout!r}): pass the seconds to wait for the server, a positive number"
        )
    if openenv_process is not None:
        base = _base_url(openenv_process)
        if base and healthy(base):
            return int(urllib.parse.urlsplit(base).port or port), openenv_process
        close = getattr(openenv_process, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001 - a client whose server is gone: nothing to close
                pass
    mine = [c for c in _CHILDREN if c.poll() is None and c.args[-1] == str(port)]  # started here, on that port
    if mine and healthy(f"http://{HOST}:{port}"):
        return port, openenv_class(base_url=f"http://{HOST}:{port}")  # a server of this run still answers there
    if isinstance(port, int) and 0 < port < 65536 and is_port_open(HOST, port):
        print(
            f"slimrl: launch_openenv: port {port} is taken by a server this run did not start (another user's or "
            f"program's): this run starts its own on a free port",
            flush=True,
        )
    return _start(Path(working_directory), server, environment or {}, openenv_class, timeout)


def _guarded(server: list[str], **popen: Any) -> subprocess.Popen:
    """``server`` started under its guard (module docstring), one of this run's children."""
    child = spawn_for_process(
        server_guard.command(server), **popen, preexec_fn=functools.partial(die_with_parent, signal.SIGTERM)
    )
    _CHILDREN.append(child)
    return child


def _start(directory: Path, server: str, environment: dict, openenv_class: Any, timeout: float) -> tuple[int, Any]:
    port = _free_port()
    env = {**os.environ, **{str(k): str(v) for k, v in environment.items()}}
    env["PYTHONPATH"] = _pythonpath(directory.resolve(), env.get("PYTHONPATH"))
    log = Path(tempfile.mkstemp(prefix=f"slimrl-openenv-{port}-", suffix=".log")[1])
    with open(log, "w") as out:
        child = _guarded(
            [sys.executable, "-m", "uvicorn", server, "--host", HOST, "--port", str(port)],
            cwd=directory,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://{HOST}:{port}"
    deadline = time.monotonic() + timeout
    while not is_port_open(HOST, port):
        if child.poll() is not None:
            raise RuntimeError(
                f"launch_openenv: the server {server!r} exited ({child.returncode}) before listening "
                f"on {base}: {_last_line(log)} (log: {log})"
            )
        if time.monotonic() > deadline:
            _end(child)
            raise RuntimeError(
                f"launch_openenv: the server {server!r} did not listen on {base} within {timeout:.0f} "
                f"s: {_last_line(log)} (log: {log})"
            )
        time.sleep(0.05)
    while not healthy(base):
        if time.monotonic() > deadline or child.poll() is not None:
            _end(child)
            raise RuntimeError(
                f"launch_openenv: the server {server!r} on {base} does not answer /health as healthy: "
                f"{_last_line(log)} (log: {log})"
            )
        time.sleep(0.2)
    print(f"slimrl: OpenEnv server {server} on {base} (ended with this run; log {log})", flush=True)
    return port, openenv_class(base_url=base)
