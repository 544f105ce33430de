"""A local stand-in for the Hugging Face Hub's upload endpoints (what ``huggingface_hub.HfApi.create_repo``,
``create_branch`` and ``create_commit`` call), on 127.0.0.1 at a free port, from a thread the test starts and stops.
Every file is answered "regular" at preupload, so a commit carries the files inline (base64 in the NDJSON body);
what arrived is kept per (repo, revision). A token, when set, is required (``Authorization: Bearer <token>``)."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class UploadHub:
    def __init__(self, token: str | None = None):
        self.token = token
        self.repos: dict[str, dict] = {}  # repo id -> create payload
        self.files: dict[tuple[str, str], dict[str, bytes]] = {}  # (repo, revision) -> path -> bytes
        self.commits: list[dict] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):  # noqa: N802
                hub._post(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> UploadHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def _reply(self, h, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _post(self, h) -> None:
        data = h.rfile.read(int(h.headers.get("Content-Length", 0) or 0))
        if self.token is not None and h.headers.get("Authorization") != f"Bearer {self.token}":
            return self._reply(h, 401, {"error": "Invalid credentials in Authorization header"})
        path = h.path.split("?")[0]
        if path == "/api/validate-yaml":  # a model card's metadata, checked before the commit
            return self._reply(h, 200, {})
        if path == "/api/repos/create":
            payload = json.loads(data)
            repo = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else payload["name"]
            self.repos.setdefault(repo, payload)
            return self._reply(h, 200, {"url": f"{self.url}/{repo}"})
        parts = path.strip("/").split("/")  # api, models, org, name, action, revision
        if len(parts) >= 6 and parts[:2] == ["api", "models"]:
            repo, action, revision = f"{parts[2]}/{parts[3]}", parts[4], "/".join(parts[5:])
            if repo not in self.repos:
                return self._reply(h, 404, {"error": "Repository not found"})
            if action == "branch":
                self.files.setdefault((repo, revision), {})
                return self._reply(h, 200, {})
            if action == "preupload":
                files = json.loads(data)["files"]
                return self._reply(
                    h,
                    200,
                    {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]},
                )
            if action == "commit":
                lines = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
                store = self.files.setdefault((repo, revision), {})
                for line in lines:
                    if line["key"] == "file":
                        store[line["value"]["path"]] = base64.b64decode(line["value"]["content"])
                self.commits.append({"repo": repo, "revision": revision, "header": lines[0]["value"]})
                oid = f"{len(self.commits):040x}"
                return self._reply(h, 200, {"commitUrl": f"{self.url}/{repo}/commit/{oid}", "commitOid": oid})
        return self._reply(h, 404, {"error": f"no such endpoint {path}"})
