"""``slimrl plan --gpu NAME``: the plan for a GPU of slimrl's table, before paying for one: its dtype (fp16 on a T4),
its memory for the engine's share, and with ``--fast_inference`` vLLM's start-up check beside the model with what the
card holds (vLLM's own check runs on this JSON in tests/vllm/test_gpu_start.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from slimrl.cli import plan as plan_cli

ROOT = Path(__file__).resolve().parents[2]


def shape_dir(tmp_path: Path, shape: str) -> str:
    from transformers import AutoConfig

    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_shapes import SHAPES

    path = tmp_path / shape
    AutoConfig.for_model(**SHAPES[shape]).save_pretrained(path)
    return str(path)


def run_plan(capsys, *argv: str) -> dict:
    assert plan_cli.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_t4_plans_in_fp16_and_an_h100_in_bf16(tmp_path, capsys):
    model = shape_dir(tmp_path, "tiny")  # the dtype is the card's, whatever the model
    t4 = run_plan(capsys, "--model", model, "--gpu", "t4", "--max_completion_length", "128")
    assert t4["dtype"] == "float16" and t4["compute_capability"] == "7.5" and t4["vllm_startup_check"] == "no engine"
    assert t4["settings"]["device"] == "cuda"
    h100 = run_plan(capsys, "--model", model, "--gpu", "H100", "--max_completion_length", "128")
    assert h100["dtype"] == "bfloat16"
    assert t4["phases"]["weights"] == h100["phases"]["weights"]  # both 16-bit


def test_the_engine_start_and_the_weights_held_once(tmp_path, capsys):
    qwen = run_plan(
        capsys,
        "--model",
        shape_dir(tmp_path, "qwen3-4b"),
        "--gpu",
        "h100",
        "--fast_inference",
        "true",
        "--gpu_memory_utilization",
        "0.9",
        "--max_seq_length",
        "2048",
        "--lora_r",
        "32",
    )
    assert qwen["vllm_startup_check"] == "passes"
    engine = qwen["engine"]
    assert engine["gpu_memory_utilization"] == 0.9 and engine["total_bytes"] == int(79.19 * 2**30)
    assert engine["free_bytes_at_start"] < engine["total_bytes"] - engine["base_weight_bytes_on_gpu"]
    llama = run_plan(
        capsys,
        "--model",
        shape_dir(tmp_path, "llama-3.1-8b"),
        "--gpu",
        "l4",
        "--fast_inference",
        "true",
        "--load_in_4bit",
        "true",
        "--gpu_memory_utilization",
        "0.9",
        "--max_seq_length",
        "1024",
        "--lora_r",
        "32",
    )
    assert llama["engine"]["base_weight_bytes_on_gpu"] < 9e9  # NF4 once: the engine runs the trainer's 4-bit layers
    big = run_plan(
        capsys,
        "--model",
        shape_dir(tmp_path, "qwen3-8b"),
        "--gpu",
        "t4",
        "--fast_inference",
        "true",
        "--max_seq_length",
        "2048",
    )
    assert big["vllm_startup_check"] == "fails" and "load_in_4bit=True" in big["problem"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu", "k80"], "--gpu 'k80': not a GPU slimrl knows"),
        (["--gpu", "t4", "--gpu_memory_utilization", "1.5"], "--gpu_memory_utilization '1.5': a fraction"),
    ],
)
def test_bad_gpu_input_is_one_line(capsys, argv, message):
    assert plan_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("length", ["-1", "0", "1", str(2**63)])
def test_a_max_seq_length_the_engine_cannot_take_is_one_line(capsys, length):
    """Round 7: -1, 0, 1 and 2^63 were planned, and vLLM's start-up check "passed" on them. The bound: at least
    prompt + completion, at most the model's context (SmolLM2: 8192), before any trace."""
    argv = [
        "--gpu",
        "t4",
        "--fast_inference",
        "true",
        "--max_prompt_length",
        "64",
        "--max_completion_length",
        "64",
        "--max_seq_length",
        length,
    ]
    assert plan_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert f"--max_seq_length {length}:" in err and "(128) and at most the model's context, 8192" in err
    assert len(err.splitlines()) == 1
