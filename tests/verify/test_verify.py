"""``slimrl verify``: rows pass on an exact patch, FAIL (exit 1) on a broken one, follow the user's model config,
and bad input is one line."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from slimrl.cli import verify as verify_cli
from slimrl.verify import TOLERANCE, format_table, verify


def test_rows_pass_and_the_table_says_why_the_tolerance():
    import slimrl

    rows = verify(["grpo"], loss_type="dapo") + slimrl.verify(["sft"], loss_type="nll")  # the Python API
    assert [(r.trainer, r.loss_type, r.passed) for r in rows] == [("grpo", "dapo", True), ("sft", "nll", True)]
    assert all(0 < r.grad_err < TOLERANCE[torch.float32] for r in rows), "no gradient compared: vacuous"
    table = format_table(rows)
    assert "PASS" in table and "tolerance 1e-04: fp32: slimrl and TRL sum the vocabulary" in table


def test_agentic_rows_pass_and_catch_a_broken_layout(monkeypatch):
    """``tools``, ``environment``, ``rollout_func``: scripted multi-turn rollouts, TRL alone vs patched; a broken
    shared-prefix attention (each position's output mixed with its neighbour's) fails every row."""
    from slimrl.ops import prefix_attention
    from slimrl.verify.agentic import available

    kinds = available()
    if not kinds:
        pytest.skip("this TRL's GRPO has no agentic paths")
    rows = [row for kind in kinds for row in verify(["grpo"], loss_type=kind)]
    assert [(r.loss_type, r.passed) for r in rows] == [(k, True) for k in kinds]
    assert all(0 < r.grad_err for r in rows), "no gradient compared: vacuous"
    real = prefix_attention.shared_prefix_attention

    def leaky(query, key, value, layout, **kwargs):
        out = real(query, key, value, layout, **kwargs)  # [R, T, h, d]
        return out + 1e-3 * out.roll(1, dims=1)

    from slimrl.patching.routes import shared_prefix

    monkeypatch.setattr(shared_prefix, "shared_prefix_attention", leaky)
    broken = [row for kind in kinds for row in verify(["grpo"], loss_type=kind)]
    assert not any(r.passed for r in broken)


def test_sabotaged_op_fails_and_exits_1(monkeypatch, capsys):
    """Break the op on purpose (temperature ignored): verify must see it."""
    from slimrl.ops import chunked_logprob

    real = chunked_logprob._logits
    monkeypatch.setattr(
        chunked_logprob, "_logits", lambda h, w, b, scale, softcap, temperature: real(h, w, b, scale, softcap, 1.0)
    )
    assert verify_cli.main(["--algorithm", "grpo", "--loss_type", "dapo", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "0 passed, 1 failed" in out


def test_tiny_copy_of_the_users_model_config(tmp_path):
    """A Gemma-2-style config (logit soft-capping, tied head, its own architecture) shrunk and verified."""
    from transformers import Gemma2Config

    from slimrl.verify.tiny import char_tokenizer

    config = Gemma2Config(
        vocab_size=49,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        final_logit_softcapping=30.0,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    config.save_pretrained(tmp_path / "gemma")
    char_tokenizer().save_pretrained(tmp_path / "gemma")
    (row,) = verify(["grpo"], loss_type="dapo", model=str(tmp_path / "gemma"))
    assert row.passed, row


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--algorithm", "grpoo"], "--algorithm grpoo: unknown algorithm 'grpoo'; valid names:"),
        (["--algorithm", "grpo", "--loss_type", "nope"], "--loss_type nope: grpo has grpo, "),
        (["--algorithm", "ppo"], "--algorithm ppo: not verified"),
        (["--device", "cuda"], "--device cuda: no CUDA device is visible here"),
        (["--model", "/no/such/model"], "no such file or directory"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (
            ["--algorithm", "dpo", "--unsloth_num_chunks", "0"],
            "--unsloth_num_chunks=0 is invalid: use -1 (chosen from free memory) or an int >= 1",
        ),
    ],
)
def test_bad_input_is_one_line(capsys, argv, message):
    if argv[:2] == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("CUDA is here")
    assert verify_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("slimrl verify: error: ") and message in err and "\n" not in err, err


def test_a_generator_that_ignores_the_adapter_fails_the_generation_check(monkeypatch):
    """Rollouts sampled without the adapter while training scores with it (the loss still looks normal): the
    generation column catches it."""
    from slimrl.models import modes
    from slimrl.patching.trainers import grpo
    from slimrl.verify import GEN_TOLERANCE

    def without_adapter(model):
        model.disable_adapter_layers()
        return modes.for_inference(model)

    def with_adapter(model):
        model.enable_adapter_layers()
        return modes.for_training(model)

    monkeypatch.setattr(grpo, "for_inference", without_adapter)
    monkeypatch.setattr(grpo, "for_training", with_adapter)
    (row,) = verify(["grpo"], loss_type="dapo")
    assert row.gen_err > 100 * GEN_TOLERANCE[torch.float32] and not row.passed


def test_quantized_rows_catch_a_4bit_layer_left_without_gradient(monkeypatch, avx512bf16):
    """A 4-bit base on a CPU whose bitsandbytes repacks layers in eval mode (simulated by the fixture): verify
    passes with slimrl's preparation and fails without it."""
    pytest.importorskip("bitsandbytes", minversion="0.50")
    from slimrl.models import modes
    from slimrl.patching.every_trainer import trainer_init

    (row,) = verify(["grpo"], loss_type="dapo", load_in_4bit=True)
    assert row.passed and row.tolerance == TOLERANCE[torch.bfloat16], row  # TRL trains a QLoRA adapter in bf16
    assert 0 < row.grad_err
    monkeypatch.setattr(modes, "keep_quantized_trainable", lambda model: 0)
    monkeypatch.setattr(trainer_init, "keep_quantized_trainable", lambda model: 0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*an autograd kernel was not registered")
        (broken,) = verify(["grpo"], loss_type="dapo", load_in_4bit=True)
    assert not broken.passed and broken.grad_err > 0.1, broken


def test_quantized_rows_are_the_lora_scenarios():
    pytest.importorskip("bitsandbytes", minversion="0.50")
    from slimrl.errors import InputError

    with pytest.raises(InputError, match="--load_in_4bit: dpo: it trains every weight, which a quantized base cannot"):
        verify(["dpo"], load_in_4bit=True)
    with pytest.raises(InputError, match="--load_in_4bit and --load_in_8bit: pass one of them"):
        verify(["grpo"], load_in_4bit=True, load_in_8bit=True)


def test_every_trainer_has_a_scenario_or_says_why_not():
    """A trainer is its module plus its row in the table: its verify scenario lives in the module, and one without
    a scenario states why (slimrl verify prints it)."""
    from slimrl.patching.table import TRAINERS

    for name, spec in TRAINERS.items():
        about = spec.about
        assert bool(about.scenario) != bool(about.not_verified), (name, about.scenario, about.not_verified)
        if about.scenario:
            assert about.scenario.__module__ == f"slimrl.patching.trainers.{name}", name


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "'not a url' is not a server URL"),
        ("http://[::1", "'http://[::1' is not a server URL"),  # an unclosed IPv6 bracket: urllib raises on it
        ("http://127.0.0.1:9", "nothing answers at http://127.0.0.1:9"),
    ],
)
def test_a_server_row_that_cannot_reach_a_server_is_one_line_never_a_pass(tmp_path, capsys, monkeypatch, url, message):
    """Nothing listening, or not a URL: exit 2 in one line before any training (it passed before, running no server
    at all). vLLM is reported present here so the URL itself is what is checked."""
    from slimrl.verify import server_check

    monkeypatch.setattr("slimrl.generation.vllm_status", lambda: None)
    model = tmp_path / "m"
    model.mkdir()
    assert verify_cli.main(["--algorithm", "grpo", "--model", str(model), "--vllm_server_base_url", url]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("slimrl verify: error: --vllm_server_base_url: ") and message in err and "\n" not in err
    assert server_check.server_problem("http://127.0.0.1:9", timeout=1)


def test_a_server_row_without_vllm_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("slimrl.generation.vllm_status", lambda: "vLLM is not installed")
    model = tmp_path / "m"
    model.mkdir()
    assert (
        verify_cli.main(
            ["--algorithm", "grpo", "--model", str(model), "--vllm_server_base_url", "http://127.0.0.1:8000"]
        )
        == 2
    )
    assert "TRL's server mode needs vLLM here too (vLLM is not installed)" in capsys.readouterr().err


def test_a_generator_row_that_did_not_use_vllm_fails():
    from slimrl.verify import Row

    row = Row(
        "grpo",
        "dapo",
        math.nan,
        math.nan,
        math.nan,
        math.nan,
        0.0,
        gen_err=1e-5,
        gen_tolerance=2e-3,
        generator="server",
    )
    assert row.passed
    row.problem = "the run did not generate through the server (use_vllm was off)"
    assert not row.passed


def test_the_update_tolerance_of_16_bit_weights_is_what_rounding_can_do_and_no_more():
    """Simulated bf16 steps: updates from gradients that differ by the tolerance t stay within the derived update
    tolerance (and not far below it: the bound is not vacuous); an update 30 % off exceeds it."""
    from slimrl.verify import TOLERANCE, rounding_exposure

    g = torch.Generator().manual_seed(0)
    w = (torch.randn(20000, generator=g) * 0.05).to(torch.bfloat16)
    exact = torch.randn(20000, generator=g) * 2e-4  # below the weights' spacing for many: LoRA's first steps
    t = TOLERANCE[torch.bfloat16]

    def step(update):
        return (w.float() + update).to(torch.bfloat16).float() - w.float()

    ref = step(exact)
    exposure = rounding_exposure({"w": (w.float() + ref).to(torch.bfloat16)}, {"w": ref})
    tol = 3 * math.sqrt(t * exposure) / float(ref.norm())
    noisy = step(exact * (1 + t * torch.randn(20000, generator=g)))
    err = float((noisy - ref).norm() / ref.norm())
    assert tol / 30 < err <= tol, (err, tol)
    wrong = step(exact * 1.3)
    assert float((wrong - ref).norm() / ref.norm()) > tol


def test_where_trls_triton_kernel_serves_the_fused_head_that_is_the_path_verify_expects(monkeypatch):
    """On a GPU with TRL's Triton kernel, DPO/KTO/SFT (the fused head their one route) hand every projection to it
    unless a chunking is chosen, so their rows do not ask for slimrl's op there; GRPO's capture route always runs;
    with ``unsloth_num_chunks`` set slimrl's op is expected again (seen on an H200: the DPO row failed on this)."""
    from packaging.version import Version

    from slimrl.compat import trl_info
    from slimrl.patching.routes import fused_head
    from slimrl.verify import rows
    from slimrl.verify.scenarios import Setup

    monkeypatch.setattr(trl_info, "trl_version", lambda: Version("1.16.0"))  # the fused head serves it
    setup = Setup(config=None, tokenizer=None, device="cuda", dtype=torch.bfloat16)
    for best in (True, False):
        monkeypatch.setattr(fused_head, "_trl_kernel_is_best", lambda device, best=best: best)
        assert rows._route_applies("dpo", setup) is not best and rows._route_applies("grpo", setup)
    monkeypatch.setattr(fused_head, "_trl_kernel_is_best", lambda device: True)
    setup.slimrl_fields["unsloth_num_chunks"] = 4
    assert rows._route_applies("dpo", setup) and rows._route_applies("sft", setup)
    monkeypatch.setattr(trl_info, "trl_version", lambda: Version("1.12.0"))  # before TRL's fused head
    assert not rows._route_applies("kto", setup)
