"""Before ``slimrl verify --vllm_server_base_url`` trains anything: the URL is a URL, vLLM is installed (TRL's server
client needs it; without it TRL cannot generate through a server and the row would silently run without one), and
something answers at the URL's ``/health/`` (vLLM's server, started with ``trl vllm-serve``)."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request


def server_problem(url: str, timeout: float = 5.0) -> str | None:
    """Why a server row cannot run against ``url`` (one line with the fix), or None."""
    try:
        parts = urllib.parse.urlparse(str(url))
        scheme, host, _ = parts.scheme, parts.hostname, parts.port  # a bad bracket or port raises here
    except ValueError:  # 'http://[::1' (an unclosed IPv6 bracket), a port out of range
        scheme, host = "", None
    if scheme not in ("http", "https") or not host:
        return f"{url!r} is not a server URL; pass one like http://127.0.0.1:8000 (where `trl vllm-serve` listens)"
    from slimrl.generation import vllm_status

    status = vllm_status()
    if status is not None:
        return f"TRL's server mode needs vLLM here too ({status}); the server row cannot run without it"
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health/", timeout=timeout) as reply:
            if reply.status >= 400:
                return f"{url}/health/ answered HTTP {reply.status}; is it a vLLM server (`trl vllm-serve`)?"
    except urllib.error.HTTPError as err:
        return f"{url}/health/ answered HTTP {err.code}; is it a vLLM server (`trl vllm-serve`)?"
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        return f"nothing answers at {url} ({reason}); start the server (`trl vllm-serve --model DIR`) first"
    return None
