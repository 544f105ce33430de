"""``slimrl train --task calculator`` end to end on a tiny model with a ChatML tokenizer whose template has no tools
(as SmolLM2's): slimrl's tool template is put on it, the supervised warm start runs, GRPO gets the calculator as a
tool (TRL's tool metrics in the step lines, metrics files and plot), and the held-out eval runs before, after the
warm start and after GRPO. The real model's run (it learns) is measured in the README."""

from __future__ import annotations

import csv
import json

from slimrl import unpatch
from slimrl.cli import train
from slimrl.verify.tiny import CHAT_SPECIAL, chatml_char_tokenizer
from tests.data.test_calculator import CHATML
from tests.tiny import tiny_llama


def test_calculator_task_runs_warm_start_tool_loop_and_three_evals(tmp_path, capsys):
    tok = chatml_char_tokenizer(CHAT_SPECIAL)
    tok.chat_template = CHATML
    model = tiny_llama(vocab_size=len(tok), max_position_embeddings=1024)
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    argv = [
        "--task",
        "calculator",
        "--model",
        str(tmp_path / "model"),
        "--warm_start_steps",
        "1",
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "4",
        "--max_completion_length",
        "24",
        "--max_seq_length",
        "1024",
        "--eval_size",
        "2",
        "--eval_max_new_tokens",
        "4",
        "--train_size",
        "8",
        "--use_gradient_checkpointing",
        "false",
        "--output_dir",
        str(tmp_path / "run"),
        "--save_steps",
        "10",
        "--threads",
        "1",
    ]
    try:
        assert train.main(argv) == 0
    finally:
        unpatch()
    out = capsys.readouterr().out
    assert "slimrl's ChatML tool template is used" in out
    assert "warm start: 1 supervised steps on tool-call demonstrations" in out
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert steps[0].startswith("step 1/1  loss")  # the warm start's own step line
    assert [s.split()[1] for s in steps[1:]] == ["1/2", "2/2"] and all("calls 0.00" in s for s in steps[1:])
    for name in ("answer_reward", "tool_call_reward", "reward"):
        assert f"held-out {name} (sampled at T=1.0, 2 rows)  " in out and "after warm start ->" in out
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all("tools/call_frequency" in r for r in rows)
    header = next(csv.reader((run / "metrics.csv").open()))
    assert "tools/call_frequency" in header and "tools/failure_frequency" in header
    assert "rewards/answer_reward/mean" in rows[0] and "rewards/tool_call_reward/mean" in rows[0]
    assert (run / "metrics.png").is_file() and (run / "adapter" / "adapter_model.safetensors").is_file()
    assert (
        "tools" in (run / "adapter" / "tokenizer_config.json").read_text()
        or "tool_call" in (run / "adapter" / "chat_template.jinja").read_text()
    )
