"""Adapter-only sync to a vLLM server (``vllm_mode="server"``, :mod:`slimrl.generation.server`).

The real test starts vLLM's CPU server (``.venv-vllm``) as a subprocess on 127.0.0.1 on a free port, runs two GRPO
steps of SmolLM2-135M + LoRA against it and checks that each step's samples come from the adapter the training
model had at that step (TRL's own importance-sampling metric: the server's sampled-token log-probs equal the training
model's), and that a stale adapter would have been caught (the update moved the log-probs far beyond that
tolerance). The server is stopped at the end, also on failure. The refusals use the same server or a fake one
answering on 127.0.0.1; no other address is contacted.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from slimrl.generation import vllm_status

pytestmark = pytest.mark.skipif(vllm_status() is not None, reason=f"vLLM not usable here: {vllm_status()}")

STEPS = 2
RANK = 16


@pytest.fixture(scope="module")
def model_dir():
    from slimrl.models.loader import resolve_model_path

    return str(resolve_model_path("SmolLM2-135M-Instruct"))


@pytest.fixture(scope="module")
def server(model_dir):
    from slimrl.generation.local_server import local_server

    with local_server(model_dir, lora_rank=RANK, max_model_len=256) as url:
        yield url


def _peft_model(lr_noise: float = 0.0):
    from slimrl import FastLanguageModel

    model, tok = FastLanguageModel.from_pretrained("SmolLM2-135M-Instruct", max_seq_length=256, dtype=torch.float32)
    if lr_noise:  # another checkpoint of the same shape: the server's model is not this one
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "mlp" in name:
                    p.add_(torch.randn_like(p) * lr_noise)
    model = FastLanguageModel.get_peft_model(model, r=RANK, lora_alpha=32, use_gradient_checkpointing=False)
    return model, tok


def _config(tmp_path, url, **kw):
    from trl import GRPOConfig

    base = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=24,
        max_steps=STEPS,
        learning_rate=2e-3,
        lr_scheduler_type="constant",
        beta=0.0,
        temperature=1.0,
        seed=3407,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        logging_steps=1,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=url,
    )
    return GRPOConfig(**{**base, **kw})


def _server_vs_training_gap(backend, model, prompt_ids):
    """Mean |server log-prob - training model log-prob| of 16 tokens the server samples with its current adapter."""
    out = backend.vllm_client.generate(
        [prompt_ids], n=1, max_tokens=16, temperature=1.0, logprobs=0, generation_kwargs={"seed": 1, "ignore_eos": True}
    )
    completion = out["completion_ids"][0]
    served = torch.tensor([s[0] for s in out["logprobs"][0]], dtype=torch.float64)
    ids = torch.tensor([prompt_ids + completion])
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].double()
    model.train()
    mine = logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
    return float((mine - served).abs().mean())


@pytest.fixture(scope="module")
def run(server, tmp_path_factory):
    from slimrl import PatchFastRL, unpatch
    from slimrl.data import correctness_reward, format_reward, make_arithmetic_dataset

    PatchFastRL("grpo")
    try:
        from trl import GRPOTrainer

        model, tok = _peft_model()
        initial = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
        trainer = GRPOTrainer(
            model=model,
            args=_config(tmp_path_factory.mktemp("server"), server),
            train_dataset=make_arithmetic_dataset(64),
            processing_class=tok,
            reward_funcs=[correctness_reward, format_reward],
        )
        trainer.train()
        prompt = tok("Compute 12 + 7.", add_special_tokens=False)["input_ids"]
        backend = trainer.vllm_generation
        gaps = {"before sync": _server_vs_training_gap(backend, model, prompt)}  # the last step's update not sent
        backend.sync_weights()  # as TRL does before the next generation
        gaps["now"] = _server_vs_training_gap(backend, model, prompt)
        final = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
        with torch.no_grad():  # the training model with the adapter it started from (a stale sync would serve it)
            for n, p in model.named_parameters():
                if n in initial:
                    p.copy_(initial[n])
        gaps["stale"] = _server_vs_training_gap(backend, model, prompt)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in final:
                    p.copy_(final[n])
        yield trainer, gaps
    finally:
        unpatch()


def test_two_steps_against_the_server_sync_only_the_adapter(run):
    from slimrl.generation.server import AdapterServerSync

    trainer, _ = run
    backend = trainer.vllm_generation
    assert isinstance(backend, AdapterServerSync) and backend.adapter_mode
    pusher = backend.adapter_pusher
    assert pusher.version == 1 + STEPS + 1  # the check at start, one per optimizer step, the fixture's last sync
    assert backend.vllm_client.model == pusher.current  # requests name the newest adapter
    adapter_bytes = sum(p.numel() * 4 for n, p in trainer.model.named_parameters() if "lora_" in n)
    assert adapter_bytes <= pusher.last_bytes < adapter_bytes + 64 * 2**10  # the LoRA tensors (+ header, config)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == STEPS
    for h in logs:  # TRL's metric: the server's sampled-token log-probs vs the training model's, fp32 both sides
        assert h["sampling/sampling_logp_difference/mean"] < 1e-3, h
        assert h["engine/sync_bytes"] == pusher.last_bytes and h["engine/sync_s"] > 0


def test_the_server_serves_the_updated_adapter_and_a_stale_one_would_show(run):
    _, gaps = run
    assert gaps["now"] < 1e-3, gaps
    # one optimizer step (the last, not yet sent) and the two steps since the start each moved the log-probs well
    # past the tolerance above, so serving a stale adapter would have failed the checks here and in the run
    assert gaps["before sync"] > 20 * 1e-3 and gaps["stale"] > 20 * 1e-3, gaps


def test_unreachable_server_is_one_line_before_training(tmp_path):
    from slimrl import PatchFastRL, unpatch
    from slimrl.data import correctness_reward, make_arithmetic_dataset
    from slimrl.generation.local_server import free_port

    PatchFastRL("grpo")
    try:
        from trl import GRPOTrainer

        model, tok = _peft_model()
        port = free_port()
        with pytest.raises(ConnectionError) as err:
            GRPOTrainer(
                model=model,
                args=_config(tmp_path, f"http://127.0.0.1:{port}", vllm_server_timeout=1),
                train_dataset=make_arithmetic_dataset(8),
                processing_class=tok,
                reward_funcs=[correctness_reward],
            )
        message = str(err.value)
        assert "\n" not in message and f"127.0.0.1:{port}" in message
        assert "vllm serve" in message and "--enable-lora" in message and f"--max-lora-rank {RANK}" in message
    finally:
        unpatch()


def test_a_server_with_another_model_is_an_error_at_the_first_sync(server, tmp_path):
    from slimrl import PatchFastRL, unpatch
    from slimrl.data import correctness_reward, make_arithmetic_dataset

    PatchFastRL("grpo")
    try:
        from trl import GRPOTrainer

        model, tok = _peft_model(lr_noise=0.05)
        with pytest.raises(RuntimeError, match=r"serves .* differ from the training model's by .* nats"):
            GRPOTrainer(
                model=model,
                args=_config(tmp_path, server),
                train_dataset=make_arithmetic_dataset(8),
                processing_class=tok,
                reward_funcs=[correctness_reward],
            )
    finally:
        unpatch()


class _FakeServer(BaseHTTPRequestHandler):
    """Answers like vLLM's server without LoRA support (``lora``: the ``lora_config`` it reports; ``load``: the
    status of ``/v1/load_lora_adapter``)."""

    lora: dict | None = None
    load = 404

    def _reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path.startswith("/health"):
            self._reply(200, {})
        elif self.path.startswith("/v1/models"):
            self._reply(200, {"data": [{"id": "fake", "max_model_len": 256}]})
        elif self.path.startswith("/server_info"):
            self._reply(
                200,
                {
                    "vllm_config": {
                        "lora_config": self.lora,
                        "weight_transfer_config": None,
                        "model_config": {"logprobs_mode": "processed_logprobs"},
                    }
                },
            )
        else:
            self._reply(404, {"detail": "Not Found"})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._reply(404, {"detail": "Not Found"})

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    "lora, expect",
    [
        (None, "without --enable-lora"),
        ({"max_lora_rank": 8}, "--max-lora-rank 8, below the adapter's r=16"),
        ({"max_lora_rank": 64}, "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"),
    ],
)
def test_a_server_without_lora_warns_once_and_trl_path_runs(lora, expect):
    from accelerate import Accelerator
    from trl.generation.vllm_generation import VLLMGeneration

    from slimrl.generation.server import server_generation_class

    handler = type("Fake", (_FakeServer,), {"lora": lora})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        model, tok = _peft_model()
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        with pytest.warns(UserWarning, match=expect) as record, pytest.raises(RuntimeError, match="weight-transfer"):
            # TRL's own path: its NCCL communicator needs the server's weight-transfer engine (and CUDA)
            server_generation_class(VLLMGeneration)(
                model=model,
                accelerator=Accelerator(cpu=True),
                processing_class=tok,
                mode="server",
                server_base_url=url,
                server_timeout=1,
            )
        assert sum("TRL's own path runs" in str(w.message) for w in record) == 1
    finally:
        httpd.shutdown()


def test_rloo_step_against_the_server_syncs_only_the_adapter(server, tmp_path):
    """RLOO goes through the same factory: one step, the adapter synced at start and at the step, and after a
    last sync the server's log-probs equal the trained model's."""
    from slimrl import PatchFastRL, unpatch
    from slimrl.data import correctness_reward, make_arithmetic_dataset
    from slimrl.generation.server import AdapterServerSync

    PatchFastRL("rloo")
    try:
        from trl import RLOOConfig, RLOOTrainer

        model, tok = _peft_model()
        args = RLOOConfig(
            output_dir=str(tmp_path),
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=16,
            max_steps=1,
            learning_rate=2e-3,
            report_to="none",
            use_cpu=True,
            bf16=False,
            save_strategy="no",
            logging_steps=1,
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=server,
        )
        trainer = RLOOTrainer(
            model=model,
            args=args,
            train_dataset=make_arithmetic_dataset(16),
            processing_class=tok,
            reward_funcs=[correctness_reward],
        )
        trainer.train()
        backend = trainer.vllm_generation
        assert isinstance(backend, AdapterServerSync) and backend.adapter_pusher.version == 2
        backend.sync_weights()
        prompt = tok("Compute 3 + 4.", add_special_tokens=False)["input_ids"]
        assert _server_vs_training_gap(backend, model, prompt) < 1e-3
    finally:
        unpatch()


def test_verify_server_row(server, model_dir):
    """``slimrl verify --model DIR --vllm_server_base_url URL``: the GRPO row generating through the running server
    (adapter-only sync each step) passes the generator check."""
    from slimrl.verify import verify

    rows = verify(["grpo"], loss_type="dapo", model=model_dir, vllm_server_base_url=server)
    (row,) = [r for r in rows if r.generator == "server"]
    assert row.passed and row.gen_err < 1e-3, row


def test_verify_server_row_needs_the_served_model_directory(server):
    from slimrl.errors import InputError
    from slimrl.verify import verify

    with pytest.raises(InputError, match="--vllm_server_base_url: pass --model DIR"):
        verify(["grpo"], vllm_server_base_url=server)
