"""Adapter-only weight sync to a vLLM server (TRL's ``use_vllm=True, vllm_mode="server"``) for a LoRA model.

TRL's server path (``trl/generation/vllm_generation.py``, ``VLLMGeneration.sync_weights``) merges the adapter into
the base weights, streams every weight of the model to the server through vLLM's NCCL weight-transfer engine (its
``init_communicator`` needs CUDA and a server started with ``--weight-transfer-config``) and unmerges: all the
model's bytes every optimizer step. For a PEFT model, :class:`AdapterServerSync` (mixed into TRL's class by
:func:`server_generation_class`) sends only the adapter:

* **sync** (once per optimizer step, where TRL calls ``sync_weights``): PEFT's ``save_pretrained`` writes the active
  adapter (safetensors, the LoRA tensors only) into a directory the server reads at the same path
  (``SLIMRL_ADAPTER_DIR``; default a temporary directory, i.e. the server runs on this machine or shares its
  filesystem), the server loads it under a new name (vLLM's runtime LoRA loading, ``POST /v1/load_lora_adapter``),
  TRL's client then names that adapter as the ``model`` of its requests, and the previous adapter is unloaded.
* **generation**: TRL's own server branch (gather the prompts, one request with ``n=num_generations``, broadcast),
  unchanged; TRL's client (``VLLMClient``) is built as TRL builds it, without the NCCL communicator.

Why this route: TRL 1.16's client talks to vLLM's own OpenAI server (``vllm serve``), which loads LoRA adapters at
run time when started with ``--enable-lora --max-lora-rank R`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; the
NCCL weight-transfer engine carries base-weight tensors by name only and needs CUDA. Start the server with::

    VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve MODEL --enable-lora \
        --max-lora-rank R --logprobs-mode processed_logprobs

(``VLLM_SERVER_DEV_MODE`` and ``--logprobs-mode`` are TRL's own requirements of the server.)

Checks, before training starts: an unreachable server raises one line naming the host, port and that command; a
server without LoRA support (no ``--enable-lora``, a ``--max-lora-rank`` below the adapter's, runtime loading not
allowed) gives one warning naming the flag and TRL's own path runs; the first sync loads the adapter and compares
the server's log-probs of a short sampled probe with the training model's, so a server serving another model is a
clear error there.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from slimrl.compat.runtime.callsite import warn

# A probe of this many sampled tokens checks, at the first sync, that the server serves the training model.
PROBE_TOKENS = 8
# Mean |server log-prob - training log-prob| per probe token above which the models differ (nats). The same weights
# differ by < 1e-3 in fp32 and ~0.05 between bf16 and fp32; another checkpoint of the same shape by whole nats.
PROBE_TOLERANCE = 0.5


def serve_command(model: str, host: str, port: int, rank: int) -> str:
    """The command that starts a vLLM server slimrl can sync adapters to."""
    return (
        f"VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve {model} --host {host} "
        f"--port {port} --enable-lora --max-lora-rank {rank} --logprobs-mode processed_logprobs"
    )


def _lora_rank(peft_model: Any) -> int:
    config = peft_model.peft_config[peft_model.active_adapter]
    ranks = [config.r, *(getattr(config, "rank_pattern", None) or {}).values()]
    return max(int(r) for r in ranks)


class AdapterPusher:
    """Writes the adapter where the server reads it and has the server load it under a new name."""

    def __init__(self, client: Any, directory: str | None = None) -> None:
        self.client = client
        self.base_model = client.model  # the server's own model id (TRL's client reads it from /v1/models)
        if directory is None:
            directory = tempfile.mkdtemp(prefix="slimrl-adapters-")
            atexit.register(shutil.rmtree, directory, ignore_errors=True)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.prefix = f"slimrl-{uuid.uuid4().hex[:12]}"  # unique per trainer: names never collide on a server
        self.version = 0
        self.current: str | None = None
        self.last_seconds = 0.0
        self.last_bytes = 0
        self.seconds = 0.0

    def push(self, peft_model: Any) -> str:
        """Save the active adapter, load it on the server under ``slimrl-<n>``, unload the previous one."""
        t0 = time.perf_counter()
        name = f"{self.prefix}-{self.version + 1}"
        path = self.directory / name
        adapter = peft_model.active_adapter
        peft_model.save_pretrained(str(path), selected_adapters=[adapter])
        if adapter != "default":  # PEFT writes a named adapter into a subfolder
            path = path / adapter
        response = self.client.session.post(
            f"{self.client.base_url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)}
        )
        if response.status_code != 200:
            shutil.rmtree(self.directory / name, ignore_errors=True)
            raise AdapterLoadError(response.status_code, response.text)
        previous, self.current = self.current, name
        self.client.model = name  # TRL's client names the adapter as its requests' model
        self.version += 1
        if previous is not None:
            self.client.session.post(f"{self.client.base_url}/v1/unload_lora_adapter", json={"lora_name": previous})
            shutil.rmtree(self.directory / previous, ignore_errors=True)
        self.last_bytes = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        self.last_seconds = time.perf_counter() - t0
        self.seconds += self.last_seconds
        return name


class AdapterLoadError(RuntimeError):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"the vLLM server refused the adapter ({status}): {text.strip()[:300]}")
        self.status = status
        self.text = text


class AdapterServerSync:
    """Mixed into TRL's ``VLLMGeneration`` for a PEFT model in server mode (see the module docstring)."""

    adapter_pusher: AdapterPusher | None = None  # the main process's
    adapter_mode = False  # every process's: the adapter goes to the server (else TRL's own path)

    def _init_vllm(self) -> None:
        from accelerate.utils import broadcast_object_list

        decision: list[Any] = [None]
        if self.accelerator.is_main_process:
            decision[0] = self._connect()
        broadcast_object_list(decision, from_process=0)
        self.adapter_mode = decision[0] is None
        if not self.adapter_mode:  # the server cannot load this adapter: TRL's own path, one warning
            warn(decision[0])
            self.adapter_pusher = None
            super()._init_vllm()

    def _peft_model(self) -> Any:
        return self.accelerator.unwrap_model(self.model)

    def _connect(self) -> str | None:
        """Build TRL's client; returns why the server cannot take adapters (None: it can, the adapter is loaded)."""
        from trl.generation.vllm_client import VLLMClient

        base_url = self.server_base_url or f"http://{self.server_host}:{self.server_port}"
        peft_model = self._peft_model()
        rank = _lora_rank(peft_model)
        host, port = _host_port(base_url)
        command = serve_command(_model_name(peft_model), host, port, rank)
        try:
            self.vllm_client = VLLMClient(
                base_url=base_url, group_port=self.group_port, connection_timeout=self.server_timeout
            )
        except OSError:  # TRL raises requests' ConnectionError (an OSError) once its wait for the server ends
            raise ConnectionError(
                f"vllm_mode='server': no vLLM server answers at {host}:{port} (waited "
                f"{self.server_timeout:g} s, vllm_server_timeout); start one with `{command}`, or "
                f"point vllm_server_base_url / vllm_server_host / vllm_server_port at it"
            ) from None
        fallback = (
            "; TRL's own path runs instead (it merges the adapter and pushes every base weight each step). "
            f"For adapter-only sync start the server with `{command}`"
        )
        lora = _server_lora_config(self.vllm_client)
        if lora is False:
            return f"the vLLM server at {host}:{port} was started without --enable-lora{fallback}"
        if lora and int(lora.get("max_lora_rank") or 0) < rank:
            return (
                f"the vLLM server at {host}:{port} has --max-lora-rank {lora.get('max_lora_rank')}, below the "
                f"adapter's r={rank}{fallback}"
            )
        self.adapter_pusher = AdapterPusher(self.vllm_client, os.environ.get("SLIMRL_ADAPTER_DIR"))
        try:
            self.adapter_pusher.push(peft_model)
        except AdapterLoadError as err:
            if err.status == 404 and "Not Found" in err.text:  # the route is absent: runtime loading not allowed
                self.adapter_pusher = None
                return (
                    f"the vLLM server at {host}:{port} does not load LoRA adapters at run time (start it with "
                    f"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True){fallback}"
                )
            raise RuntimeError(
                f"vllm_mode='server': {err}; the server must serve the training model's base "
                f"({_model_name(peft_model)}), started with `{command}`"
            ) from None
        self._check_same_model(peft_model, host, port)
        return None

    def _check_same_model(self, peft_model: Any, host: str, port: int) -> None:
        """The server's log-probs of a short sampled probe equal the training model's (with the adapter)."""
        import torch

        tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)
        prompt = tokenizer("The capital of France is", add_special_tokens=False)["input_ids"]
        out = self.vllm_client.generate(
            [prompt],
            n=1,
            max_tokens=PROBE_TOKENS,
            temperature=1.0,
            logprobs=0,
            generation_kwargs={"seed": 0, "ignore_eos": True},
        )
        completion = out["completion_ids"][0]
        served = torch.tensor([step[0] for step in out["logprobs"][0]], dtype=torch.float64)  # [L]
        device = next(peft_model.parameters()).device
        ids = torch.tensor([prompt + completion], device=device)  # [1, P + L]
        training = peft_model.training
        peft_model.eval()
        try:
            with torch.no_grad():
                logits = peft_model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()  # [L, V]
        finally:
            peft_model.train(training)
        mine = logits.log_softmax(-1).gather(-1, torch.tensor(completion, device=device)[:, None])[:, 0].cpu()  # [L]
        gap = float((mine - served).abs().mean())
        if gap > PROBE_TOLERANCE:
            raise RuntimeError(
                f"vllm_mode='server': the server at {host}:{port} serves {self.adapter_pusher.base_model!r}, whose "
                f"log-probs differ from the training model's by {gap:.2f} nats per token on a probe (tolerance "
                f"{PROBE_TOLERANCE}); start it with the training model's base ({_model_name(peft_model)})"
            )

    def sync_weights(self) -> None:
        """The adapter to the server under a new name (TRL's merge-and-push where the server cannot take it)."""
        if not self.adapter_mode:
            return super().sync_weights()
        peft_model = self._peft_model()
        dist = getattr(self, "_dist", None)
        lora = [p for n, p in peft_model.named_parameters() if "lora_" in n]
        gather = dist.gather_params(lora) if dist is not None else _nullcontext()
        with gather:  # ZeRO-3: every process takes part; the main one writes
            if self.accelerator.is_main_process:
                self.adapter_pusher.push(peft_model)
        return None


def _nullcontext():
    from contextlib import nullcontext

    return nullcontext()


@functools.cache
def server_generation_class(base: type) -> type:
    """TRL's ``VLLMGeneration`` with :class:`AdapterServerSync` mixed in (one class per TRL class)."""
    cls = type("SlimrlServerGeneration", (AdapterServerSync, base), {"__module__": __name__})
    cls.__doc__ = AdapterServerSync.__doc__
    return cls


def _host_port(base_url: str) -> tuple[str, int]:
    from urllib.parse import urlparse

    parsed = urlparse(base_url)
    return parsed.hostname or "", parsed.port or (443 if parsed.scheme == "https" else 80)


def _model_name(peft_model: Any) -> str:
    config = getattr(peft_model, "config", None)
    return getattr(config, "_name_or_path", "") or "MODEL"


def _server_lora_config(client: Any) -> dict | bool | None:
    """The server's LoRA config from ``/server_info`` (False: LoRA off; None: not reported)."""
    try:
        info = client.get_server_info()
    except Exception:  # noqa: BLE001 - no development endpoints: the adapter load below tells
        return None
    lora = info.get("lora_config")
    return lora if lora else False
