"""A local stand-in for the Hugging Face Hub, for the download path of ``FastLanguageModel.from_pretrained``.

It serves one directory as model repo ``repo_id`` at one commit, in the Hub's URL layout (what ``huggingface_hub``
asks for: ``/api/models/<id>/revision/<rev>``, ``/api/models/<id>/tree/<rev>``, ``/<id>/resolve/<rev>/<file>``),
on 127.0.0.1 at a free port, from a thread the test starts and stops. Nothing else is ever contacted. A token, when
set, is required (``Authorization: Bearer <token>``) as for a private repo.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, root: Path, repo_id: str, token: str | None = None, revisions: tuple[str, ...] = ("main",)):
        self.root, self.repo_id, self.token, self.revisions = Path(root), repo_id, token, revisions
        self.requests: list[str] = []
        self.files = {p.relative_to(self.root).as_posix(): p for p in sorted(self.root.rglob("*")) if p.is_file()}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):  # noqa: N802
                hub._handle(self, body=False)

            def do_GET(self):  # noqa: N802
                hub._handle(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------------ responses

    @staticmethod
    def _oid(path: Path) -> str:
        return hashlib.sha1(path.read_bytes()).hexdigest()

    def _send(self, h, status: int, payload: bytes, body: bool, headers: dict | None = None):
        h.send_response(status)
        for k, v in {"Content-Length": str(len(payload)), **(headers or {})}.items():
            h.send_header(k, v)
        h.end_headers()
        if body:
            h.wfile.write(payload)

    def _json(self, h, obj, body: bool):
        self._send(h, 200, json.dumps(obj).encode(), body, {"Content-Type": "application/json"})

    def _handle(self, h, body: bool) -> None:
        path = unquote(urlparse(h.path).path)
        self.requests.append(f"{h.command} {path}")
        if self.token and h.headers.get("Authorization") != f"Bearer {self.token}":
            return self._send(
                h,
                401,
                b'{"error": "Invalid credentials"}',
                body,
                {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"},
            )
        api, resolve = f"/api/models/{self.repo_id}/", f"/{self.repo_id}/resolve/"
        if path.startswith(api + "revision/"):
            rev = path[len(api + "revision/") :]
            if rev not in self.revisions and rev != COMMIT:
                return self._send(
                    h, 404, b"{}", body, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id"}
                )
            return self._json(
                h,
                {
                    "id": self.repo_id,
                    "modelId": self.repo_id,
                    "sha": COMMIT,
                    "private": False,
                    "siblings": [{"rfilename": f} for f in self.files],
                },
                body,
            )
        if path.startswith(api + "tree/"):
            return self._json(
                h,
                [
                    {"type": "file", "oid": self._oid(p), "size": p.stat().st_size, "path": f}
                    for f, p in self.files.items()
                ],
                body,
            )
        if path.startswith(resolve):
            rev, _, name = path[len(resolve) :].partition("/")
            if name in self.files and (rev in self.revisions or rev == COMMIT):
                data, etag = self.files[name].read_bytes(), f'"{self._oid(self.files[name])}"'
                return self._send(
                    h,
                    200,
                    data,
                    body,
                    {"X-Repo-Commit": COMMIT, "ETag": etag, "Content-Type": "application/octet-stream"},
                )
            return self._send(
                h, 404, b"{}", body, {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"}
            )
        return self._send(
            h, 404, b"{}", body, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}
        )
