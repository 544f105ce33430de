"""``launch_openenv``'s decisions without OpenEnv itself (local servers on 127.0.0.1 stand in): what counts as
healthy, that a server this run did not start is never reused, and ``timeout`` checked before anything starts
(round 7 of the reliability issue)."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest

from slimrl.environments import openenv as launcher


def _http(body: bytes):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the standard library's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize(
    ("body", "ok"),
    [
        (b'{"status": "healthy"}', True),
        (b"healthy", True),
        (b'{"status": "unhealthy"}', False),
        (b"unhealthy", False),
        (b'{"status": "degraded"}', False),
        (b"[]", False),
    ],
)
def test_healthy_is_the_environments_answer_not_any_answer(body, ok):
    server = _http(body)
    try:
        assert launcher.healthy(f"http://127.0.0.1:{server.server_address[1]}") is ok
    finally:
        server.shutdown()


def test_a_listener_that_does_not_speak_http_is_not_healthy():
    """An SSH banner on the port raised http.client.BadStatusLine out of the launch."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def banner():
        conn, _ = listener.accept()
        conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
        conn.close()

    threading.Thread(target=banner, daemon=True).start()
    try:
        assert launcher.healthy(f"http://127.0.0.1:{listener.getsockname()[1]}") is False
    finally:
        listener.close()


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), None, "5", 0, -1, True])
def test_timeout_is_checked_before_anything_starts(tmp_path, monkeypatch, timeout):
    monkeypatch.setattr(launcher, "_start", lambda *a: pytest.fail("a server was started"))
    with pytest.raises(ValueError, match=r"launch_openenv\(timeout=.*a positive number"):
        launcher.launch_openenv(working_directory=str(tmp_path), openenv_class=dict, timeout=timeout)


def test_a_healthy_server_this_run_did_not_start_is_not_reused(tmp_path, monkeypatch, capsys):
    """Round 7: another user's server on the requested port was taken as this run's."""
    server = _http(b'{"status": "healthy"}')
    port = server.server_address[1]
    started = []
    monkeypatch.setattr(launcher, "_start", lambda *a: started.append(a) or (12345, "own client"))
    try:
        got = launcher.launch_openenv(port=port, working_directory=str(tmp_path), openenv_class=dict)
    finally:
        server.shutdown()
    assert got == (12345, "own client") and len(started) == 1
    assert f"port {port} is taken by a server this run did not start" in capsys.readouterr().out


def test_a_server_this_run_started_on_the_port_is_reused(tmp_path, monkeypatch):
    """A notebook re-running its cell keeps its own server (found among this process's children by its port)."""
    from types import SimpleNamespace

    server = _http(b'{"status": "healthy"}')
    port = server.server_address[1]
    own = SimpleNamespace(poll=lambda: None, args=["python", "-m", "uvicorn", "app:app", "--port", str(port)])
    monkeypatch.setattr(launcher, "_CHILDREN", [own])
    monkeypatch.setattr(launcher, "_start", lambda *a: pytest.fail("a second server was started"))
    try:
        got_port, client = launcher.launch_openenv(port=port, working_directory=str(tmp_path), openenv_class=dict)
    finally:
        server.shutdown()
    assert got_port == port and client == {"base_url": f"http://127.0.0.1:{port}"}
