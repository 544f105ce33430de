"""OpenEnv as Unsloth's notebooks use it (``launch_openenv``, ``is_port_open``), with a real OpenEnv environment from
the package index: ``openenv init echo_env`` (openenv-core's own scaffold, an echo environment that runs offline),
served by uvicorn on the loopback interface, reached through its generated client; then GRPO trains with it through
TRL's ``environment_factory``, patched equal to TRL alone (``make test`` runs this file in ``.venv-openenv``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openenv.core", reason="needs openenv-core (make test runs this in .venv-openenv)")

from slimrl import is_port_open, launch_openenv  # noqa: E402
from slimrl.environments import openenv as launcher  # noqa: E402


@pytest.fixture(scope="module")
def echo_env(tmp_path_factory):
    """``openenv init echo_env`` in a folder of its own; the generated package importable from this process."""
    root = tmp_path_factory.mktemp("openenv")
    cli = Path(sys.executable).parent / "openenv"
    subprocess.run([str(cli), "init", "echo_env"], cwd=root, check=True, capture_output=True, timeout=300)
    sys.path.insert(0, str(root))
    from echo_env import EchoAction, EchoEnv

    yield root, EchoEnv, EchoAction
    sys.path.remove(str(root))
    launcher._end_children()


@pytest.fixture(scope="module")
def served(echo_env):
    root, client_cls, action = echo_env
    port, client = launch_openenv(
        working_directory=str(root), server="echo_env.server.app:app", openenv_class=client_cls
    )
    return port, client, action, root, client_cls


def test_a_server_on_the_loopback_interface_reached_by_its_client(served):
    port, client, action, _, _ = served
    assert is_port_open("127.0.0.1", port) and launcher.healthy(f"http://127.0.0.1:{port}")
    with client.sync() as env:
        assert "ready" in env.reset().observation.echoed_message
        step = env.step(action(message="hello"))
    assert step.observation.echoed_message == "hello" and step.reward > 0
    child = launcher._CHILDREN[-1]
    assert child.poll() is None and f"--port {port}" in " ".join(child.args) and "127.0.0.1" in child.args


def test_a_client_whose_server_answers_is_kept(served):
    port, client, _, root, client_cls = served
    again_port, again = launch_openenv(
        port=port,
        openenv_process=client,
        working_directory=str(root),
        server="echo_env.server.app:app",
        openenv_class=client_cls,
    )
    assert (again_port, again) == (port, client) and len(launcher._CHILDREN) == 1


def test_bad_input_and_a_failing_server_are_one_line(echo_env, tmp_path):
    root, client_cls, _ = echo_env
    for kwargs, message in [
        ({"openenv_class": None}, "openenv_class"),
        ({"server": "no_colon"}, "module.path"),
        ({"working_directory": str(tmp_path / "missing")}, "working_directory"),
    ]:
        args = {
            "working_directory": str(root),
            "server": "echo_env.server.app:app",
            "openenv_class": client_cls,
            **kwargs,
        }
        with pytest.raises(ValueError, match=message):
            launch_openenv(**args)
    with pytest.raises(RuntimeError, match=r"exited .* before listening.*no_such_env") as err:
        launch_openenv(working_directory=str(root), server="no_such_env.app:app", openenv_class=client_cls, timeout=60)
    assert "\n" not in str(err.value)


def test_grpo_with_an_openenv_environment_equals_trl_alone(served, tmp_path):
    """TRL's ``environment_factory``: each rollout's environment calls the live OpenEnv server as its tool; the
    scripted turns call it, the results reach the completions, patched equals TRL alone."""
    from slimrl.verify.agentic import call_text
    from tests.patching.test_agentic_parity import _parity

    _, client, action, _, _ = served
    session = client.sync()
    session.connect()

    class OpenEnvEcho:
        def reset(self, **kwargs):
            session.reset()
            return None

        def echo(self, message: str) -> str:
            """Send a message to the OpenEnv echo environment and get it back.

            Args:
                message: what to send
            """
            return session.step(action(message=message)).observation.echoed_message

    turns = [
        call_text("echo", message="hey"),
        call_text("echo", message="there"),
        "plain answer<|im_end|>",
        call_text("echo", text="wrong"),
        call_text("echo", message="x" * 3),
        "done<|im_end|>",
    ]
    _, logged = _parity(tmp_path, {"environment_factory": OpenEnvEcho}, first=turns)
    assert any(h.get("tools/call_frequency", 0) > 0 for h in logged), logged


@pytest.mark.skipif(shutil.which("uvicorn", path=str(Path(sys.executable).parent)) is None, reason="no uvicorn")
def test_children_end_with_the_run(echo_env):
    root, client_cls, _ = echo_env
    code = (
        f"import sys; sys.path.insert(0, {str(root)!r}); from echo_env import EchoEnv; "
        f"from slimrl import launch_openenv; port, _ = launch_openenv(working_directory={str(root)!r}, "
        f"server='echo_env.server.app:app', openenv_class=EchoEnv); print('PORT', port)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    port = int(next(ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("PORT")))
    assert not is_port_open("127.0.0.1", port), "the server outlived the process that started it"


HANGING_APP = """
import os, subprocess, sys, time
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
                open({pids!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
                await send({{"type": "lifespan.startup.complete"}})
            else:
                time.sleep(600)  # a shutdown hook that hangs
    await send({{"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}})
    await send({{"type": "http.response.body", "body": b'{{"status": "healthy"}}'}})
"""


@pytest.mark.skipif(shutil.which("uvicorn", path=str(Path(sys.executable).parent)) is None, reason="no uvicorn")
def test_a_server_whose_shutdown_hangs_ends_when_the_trainer_is_killed(tmp_path):
    """Round 7: an environment whose shutdown hook hangs outlived a SIGKILL of the trainer (with a process it had
    started); the guard's process group ends both after its grace."""
    import signal
    import time

    from slimrl.environments.server_guard import SHUTDOWN_GRACE

    pids = tmp_path / "pids"
    (tmp_path / "hanging_app.py").write_text(HANGING_APP.format(pids=str(pids)))
    code = (
        f"import time; from slimrl import launch_openenv; port, _ = launch_openenv(working_directory="
        f"{str(tmp_path)!r}, server='hanging_app:app', openenv_class=dict); print('PORT', port, flush=True); "
        f"time.sleep(600)"
    )
    trainer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line = ""
        while not line.startswith("PORT"):
            line = trainer.stdout.readline()
            assert line, "the trainer ended before its server answered"
        port = int(line.split()[1])
        started = [int(x) for x in pids.read_text().split()]
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    deadline = time.monotonic() + SHUTDOWN_GRACE + 15
    while time.monotonic() < deadline and (is_port_open("127.0.0.1", port) or any(map(_running, started))):
        time.sleep(0.2)
    assert not is_port_open("127.0.0.1", port), "the server outlived the killed trainer"
    assert not any(map(_running, started)), "the server or the process it started outlived the killed trainer"


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
