"""``slimrl verify``: rows pass on an exact patch, FAIL (exit 1) on a broken one, follow the user's model config,
and bad input is one line."""

from __future__ import annotations

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


def test_sabotaged_op_fails_and_exits_1(monkeypatch, capsys):
    """Break the op on purpose (temperature ignored): verify must see it."""
    from slimrl.ops import chunked_logprob

    real = chunked_logprob._logits
    monkeypatch.setattr(chunked_logprob, "_logits", lambda h, w, b, scale, softcap, temperature:
                        real(h, w, b, scale, softcap, 1.0))
    assert verify_cli.main(["--algorithm", "grpo", "--loss_type", "dapo", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "0 passed, 1 failed" in out


def test_tiny_copy_of_the_users_model_config(tmp_path):
    """A Gemma-2-style config (logit soft-capping, tied head, its own architecture) shrunk and verified."""
    from transformers import Gemma2Config

    from slimrl.verify.tiny import char_tokenizer

    config = Gemma2Config(vocab_size=49, hidden_size=256, intermediate_size=512, num_hidden_layers=6,
                          num_attention_heads=8, num_key_value_heads=4, head_dim=32, final_logit_softcapping=30.0,
                          pad_token_id=0, eos_token_id=1, bos_token_id=2)
    config.save_pretrained(tmp_path / "gemma")
    char_tokenizer().save_pretrained(tmp_path / "gemma")
    (row,) = verify(["grpo"], loss_type="dapo", model=str(tmp_path / "gemma"))
    assert row.passed, row


@pytest.mark.parametrize(("argv", "message"), [
    (["--algorithm", "grpoo"], "--algorithm grpoo: unknown algorithm 'grpoo'; valid names:"),
    (["--algorithm", "grpo", "--loss_type", "nope"], "--loss_type nope: grpo has grpo, "),
    (["--algorithm", "ppo"], "--algorithm ppo: not verified"),
    (["--device", "cuda"], "--device cuda: no CUDA device is visible here"),
    (["--model", "/no/such/model"], "no such file or directory"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_input_is_one_line(capsys, argv, message):
    if argv[:2] == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("CUDA is here")
    assert verify_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("slimrl verify: error: ") and message in err and "\n" not in err, err
