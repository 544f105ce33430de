"""``slimrl compare`` on the CPU at a tiny size: each side in its own process, the same first step on both, the
plan's prediction beside the measurement, a JSON record; a side that fails or runs out of memory is reported and
the others go on; bad input is one line."""

from __future__ import annotations

import json
import sys

import pytest

from slimrl.cli import compare


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tests.tiny import tiny_llama, tiny_tokenizer

    path = tmp_path_factory.mktemp("model")
    tiny_llama().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


def test_trl_alone_and_slimrl_measured_side_by_side(tiny_dir, tmp_path, capsys):
    record = tmp_path / "record.json"
    rc = compare.main(
        [
            "--model",
            tiny_dir,
            "--num_generations",
            "2",
            "--max_prompt_length",
            "8",
            "--max_completion_length",
            "8",
            "--lora_r",
            "4",
            "--sides",
            "trl,slimrl,trl-liger",
            "--json",
            str(record),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads(record.read_text())
    trl, ours = data["sides"]["trl"], data["sides"]["slimrl"]
    assert trl["peak_gb"] > 0 and ours["peak_gb"] > 0 and len(ours["step_s"]) == 2
    assert ours["first_grad_norm"] > 0 and data["loss_agreement"].startswith("agree")
    assert "skipped" in data["sides"]["trl-liger"]  # Liger needs CUDA: reported, the others ran
    assert data["predicted"]["slimrl"]["peak_gb"] > 0 and data["predicted"]["trl"]["peak_gb"] > 0
    assert "x TRL alone" in out and "trl-liger  skipped" in out


def _fake(script: str) -> list[str]:
    return [sys.executable, "-c", script]


def test_a_side_that_fails_or_runs_out_of_memory_is_reported_and_the_others_go_on():
    from slimrl.cli.compare_worker import RESULT_TAG

    ok = json.dumps({"side": "trl", "peak_gb": 1.0, "reserved_gb": 1.0, "step_s": [0.1], "first_loss": 0.5})
    commands = {
        "oom": _fake(
            "import sys; print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB', "
            "file=sys.stderr); sys.exit(1)"
        ),
        "broken": _fake("raise SystemExit(3)"),
        "trl": _fake(f"print({RESULT_TAG + ok!r})"),
        "slow": _fake("import time; time.sleep(30)"),
    }
    results = compare.run_sides(["oom", "broken", "slow", "trl"], commands.__getitem__, timeout=5)
    assert "out of memory" in results["oom"]["oom"].lower()
    assert results["broken"]["failed"].startswith("exit 3")
    assert "no result within 5 s" in results["slow"]["failed"]
    assert results["trl"]["peak_gb"] == 1.0  # the last side still ran
    text = compare.table(results, {})
    assert "oom        out of memory" in text and "broken     failed" in text


def test_compare_exits_1_when_a_side_was_not_measured(monkeypatch, tmp_path, capsys):
    """Every side failed (or one did): the results are printed and written, and the exit status says so."""
    monkeypatch.setattr(compare, "worker_command", lambda args, side, path: _fake("raise SystemExit(3)"))
    monkeypatch.setattr(compare, "prediction", lambda args, path: {})
    record = tmp_path / "r.json"
    assert compare.main(["--json", str(record), "--max_completion_length", "4", "--steps", "1"]) == 1
    assert "not measured: trl, slimrl (exit 1)" in capsys.readouterr().out
    assert json.loads(record.read_text())["sides"]["trl"]["failed"].startswith("exit 3")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--max_completion_length", "0"], "--max_completion_length 0"),
        (["--sides", "trl,nope"], "--sides nope"),
        (["--device", "tpu"], "--device 'tpu'"),
        (["--device", "cuda"], "no CUDA device"),
        (["--max_completion_length", "100000000"], "larger than any run"),
        (["--timeout", "100000000000000000000"], "at most a week"),
        (["--json", "/nonexistent-folder/out.json"], "the folder /nonexistent-folder does not exist"),
        (["--json", "/tmp"], "not a regular file"),
        (["--json", "/dev/null"], "not a regular file"),
    ],
)
def test_bad_input_is_one_line(argv, needle, capsys):
    pytest.importorskip("torch")
    import torch

    if argv == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert compare.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and err[0].startswith("slimrl compare: error:")
