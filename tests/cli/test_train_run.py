"""`slimrl train` end to end on a tiny model: outputs, and a SIGKILL-ed run resumed to the same adapter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from slimrl import unpatch
from slimrl.cli import train
from tests.tiny import tiny_llama, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def setup(tmp_path):
    tiny_llama().save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{a}+{a + 1}="}) for a in range(40)))
    return tmp_path


def _argv(tmp_path: Path, out: str, steps: int = 4) -> list[str]:
    return [
        "--model",
        str(tmp_path / "model"),
        "--dataset",
        str(tmp_path / "data.jsonl"),
        "--reward",
        "tests.cli.rewards:digits",
        "--max_steps",
        str(steps),
        "--save_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "4",
        "--max_completion_length",
        "8",
        "--max_seq_length",
        "64",
        "--eval_size",
        "4",
        "--eval_max_new_tokens",
        "6",
        "--learning_rate",
        "0.05",
        "--use_gradient_checkpointing",
        "false",
        "--output_dir",
        str(tmp_path / out),
        "--save_total_limit",
        "5",
        "--disable_tqdm",
        "true",
        "--threads",
        "1",
    ]


def test_run_writes_adapter_metrics_plot_and_summary(setup, capsys):
    try:
        assert train.main(_argv(setup, "run")) == 0
    finally:
        unpatch()
    out = setup / "run"
    stdout = capsys.readouterr().out
    assert "slimrl train: summary" in stdout and "held-out digits (greedy, 4 rows)" in stdout
    steps = [line for line in stdout.splitlines() if line.startswith("step ")]
    assert [s.split()[1] for s in steps] == ["1/4", "2/4", "3/4", "4/4"] and "reward" in steps[0]
    assert "{'loss'" not in stdout, "TRL's raw log dictionary is printed"
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert (out / "adapter" / "tokenizer.json").is_file()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all("reward" in r and "memory/peak_mb" in r for r in rows)
    assert (out / "metrics.csv").read_text().splitlines()[0].startswith("step,loss,reward")
    assert (out / "metrics.png").stat().st_size > 10_000
    assert (out / "checkpoint-2" / "optimizer.pt").is_file() and (out / "checkpoint-4" / "rng_state.pth").is_file()


def test_tensorboard_gets_the_health_metrics_and_the_summary_its_section(setup, capsys):
    """``--report_to tensorboard`` as in TRL (the real package writes the events, its reader reads them back); the
    run-health metrics are among them, and the summary ends with one line per check."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    argv = _argv(setup, "tb", steps=3) + [
        "--report_to",
        "tensorboard",
        "--slimrl_health_window",
        "2",
        "--slimrl_health_min_groups",
        "1",
        "--save_steps",
        "10",
    ]
    try:
        assert train.main(argv) == 0
    finally:
        unpatch()
    (events,) = (setup / "tb").rglob("events.out.tfevents.*")
    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/reward", "train/frac_reward_zero_std", "train/health/no_signal", "train/health/truncated"} <= tags
    assert [e.step for e in acc.Scalars("train/health/truncated")] == [2, 3]
    stdout = capsys.readouterr().out
    health = [line for line in stdout.splitlines() if line.startswith("health: ")]
    assert [line.split()[1] for line in health] == [
        "no_signal",
        "truncated",
        "entropy",
        "kl",
        "clip",
        "not_finite",
        "reward_conflict",
        "sampler_mismatch",
    ]
    status = {line.split()[1]: line.split(None, 2)[2].strip() for line in health}
    assert status["no_signal"] in ("ok", "warned at step 2", "warned at step 3") and status["kl"] in ("ok",)
    assert status["entropy"] == "not judged (too few logged steps)"  # two windows of 2 needed, 3 steps run
    assert status["reward_conflict"] == "not judged (one reward function)"
    assert status["sampler_mismatch"].startswith("not judged (sampling/kl_k3/mean not logged")  # HF generate


def test_resume_at_max_steps_trains_no_further_step(setup, capsys):
    """transformers resumed at ``max_steps`` runs one step past it (TRL alone ends at step 3 of 2); ``slimrl
    train --resume`` loads the checkpoint and saves its adapter without a step."""
    try:
        assert train.main(_argv(setup, "done", steps=2)) == 0
        capsys.readouterr()
        ckpt = load_file(setup / "done" / "checkpoint-2" / "adapter_model.safetensors")
        (setup / "done" / "adapter" / "adapter_model.safetensors").unlink()  # as if killed after the checkpoint
        assert train.main(_argv(setup, "done", steps=2) + ["--resume"]) == 0
    finally:
        unpatch()
    stdout = capsys.readouterr().out
    assert "checkpoint-2 is at step 2, --max_steps 2: nothing left to train" in stdout
    assert not [line for line in stdout.splitlines() if line.startswith("step ")]
    steps = [json.loads(x)["step"] for x in (setup / "done" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    saved = load_file(setup / "done" / "adapter" / "adapter_model.safetensors")
    assert saved.keys() == ckpt.keys() and all(torch.equal(saved[k], ckpt[k]) for k in ckpt)
    assert any(v.abs().sum() > 0 for k, v in ckpt.items() if "lora_B" in k), "the checkpoint is the fresh adapter"


def _cli(tmp_path: Path, out: str, extra: list[str] = (), env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "slimrl", "train", *_argv(tmp_path, out, steps=6), *extra],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_adapter(setup):
    """A real SIGKILL of the training process after its first checkpoint; `--resume` then reaches the adapter
    of an uninterrupted run with the same seed (fp32 CPU: bit-identical is expected; compared at 1e-6)."""
    full = _cli(setup, "full")
    assert full.wait(timeout=300) == 0, full.stdout.read()

    killed = _cli(setup, "killed", env={"SLIMRL_TEST_REWARD_SLEEP": "0.5"})
    ckpt = setup / "killed" / "checkpoint-2" / "trainer_state.json"
    deadline = time.time() + 240
    while not ckpt.is_file() and killed.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert ckpt.is_file(), "no checkpoint appeared before the kill"
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    assert not (setup / "killed" / "adapter").exists(), "the run finished before it was killed"
    assert (setup / "killed" / "checkpoint-2" / "adapter_model.safetensors").is_file()

    resumed = _cli(setup, "killed", extra=["--resume"])
    log = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, log
    assert "resumed from" in log
    a = load_file(setup / "full" / "adapter" / "adapter_model.safetensors")
    b = load_file(setup / "killed" / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-6, atol=1e-7)
    mid = load_file(setup / "killed" / "checkpoint-2" / "adapter_model.safetensors")
    assert any(not torch.equal(mid[k], a[k]) for k in a), "steps 3-6 changed nothing: the comparison is vacuous"
    steps = [json.loads(x)["step"] for x in (setup / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
