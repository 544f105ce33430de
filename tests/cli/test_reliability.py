"""`slimrl train` under bad input and faults: one line naming the option or file and the fix, exit 2, before the
model loads; nothing a user has is lost or silently replaced.

:data:`CASES` is also the README's "Reliability" table: :func:`table` runs every case and renders it, and
``test_readme_table_is_current`` fails when the README's copy differs (regenerate with
``python -m tests.cli.test_reliability``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from slimrl.cli import train
from tests.tiny import tiny_llama, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def _tiny_model(tmp: Path) -> Path:
    if not (tmp / "model" / "config.json").is_file():
        tiny_llama().save_pretrained(tmp / "model")
        tiny_tokenizer().save_pretrained(tmp / "model")
    return tmp / "model"


def _write(tmp: Path, name: str, text: str | bytes) -> Path:
    path = tmp / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def _gguf_prefix(tmp: Path, n_bytes: int) -> Path:
    from slimrl.models.loader import smollm2_gguf_path

    with smollm2_gguf_path().open("rb") as f:
        return _write(tmp, f"cut{n_bytes}.gguf", f.read(n_bytes))


def _checkpoint(out: Path, step: int, r: int = 16, algorithm: str = "grpo") -> Path:
    """A complete checkpoint directory as the Trainer writes it (small stand-in tensors)."""
    from safetensors.torch import save_file

    ckpt = out / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    save_file({"a": torch.zeros(2, 2)}, ckpt / "adapter_model.safetensors")
    torch.save({"state": {}, "param_groups": [{"params": [0], "lr": 1e-5}]}, ckpt / "optimizer.pt")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (ckpt / "adapter_config.json").write_text(json.dumps({"r": r, "target_modules": ["q_proj"]}))
    (ckpt / "slimrl_run.json").write_text(json.dumps({"algorithm": algorithm, "lora_r": r}))
    return ckpt


def _long_prompts(tmp: Path) -> list[str]:
    data = _write(
        tmp, "long.jsonl", "\n".join(json.dumps({"prompt": "1+1=" * (30 if i % 4 == 0 else 1)}) for i in range(8))
    )
    return [
        "--model",
        str(_tiny_model(tmp)),
        "--dataset",
        str(data),
        "--max_seq_length",
        "64",
        "--max_completion_length",
        "8",
    ]


def _fifo(tmp: Path) -> str:
    import os

    path = tmp / "ds.json"
    os.mkfifo(path)
    return str(path)


def _bomb() -> str:
    """434 bytes that a YAML loader expands to millions of values (each level 9 aliases of the one before)."""
    lines = ['l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 7)]
    return "\n".join(lines) + "\ndataset: *l6\n"


def _live_lock(tmp: Path) -> list[str]:
    out = tmp / "out"
    out.mkdir()
    (out / ".slimrl.lock").write_text(
        json.dumps({"pid": os.getppid(), "host": os.uname().nodename, "started": "2026-11-23 10:00:00"})
    )
    return []


# (what the user did, argv builder (gets a temp dir; --output_dir tmp/out is added unless the case sets it),
#  the message it must print)
CASES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    ("--config file missing", lambda t: ["--config", str(t / "run.yaml")], r"--config \S+run.yaml: file not found"),
    (
        "YAML value of the wrong type",
        lambda t: ["--config", str(_write(t, "run.yaml", "max_steps: abc\n"))],
        r"--config \S+run.yaml: key max_steps: 'abc' is not a valid int",
    ),
    ("flag of the wrong type", lambda t: ["--max_steps", "abc"], r"--max_steps: invalid int value: 'abc'"),
    (
        "JSONL with a broken line",
        lambda t: ["--dataset", str(_write(t, "d.jsonl", '{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c"\n'))],
        r"--dataset \S+d.jsonl: line 3 is not valid JSON",
    ),
    ("empty .jsonl", lambda t: ["--dataset", str(_write(t, "d.jsonl", ""))], r"the file is empty"),
    ("header-only CSV", lambda t: ["--dataset", str(_write(t, "d.csv", "prompt\n"))], r"the file has no rows"),
    ("`[]` JSON", lambda t: ["--dataset", str(_write(t, "d.json", "[]"))], r"the file has no rows"),
    ("--train_size 0", lambda t: ["--train_size", "0"], r"--train_size 0: the built-in task needs at least 1"),
    ("--learning_rate 0", lambda t: ["--learning_rate", "0"], r"--learning_rate 0.0: must be > 0"),
    ("negative --learning_rate", lambda t: ["--learning_rate=-1e-5"], r"--learning_rate -1e-05: must be > 0"),
    (
        "--max_completion_length 0",
        lambda t: ["--max_completion_length", "0"],
        r"max_completion_length=0 is invalid: it must be >= 1",
    ),
    ("--temperature 0", lambda t: ["--temperature", "0"], r"temperature=0.0 is invalid: it must be > 0 and <= 10"),
    ("--temperature 11", lambda t: ["--temperature", "11"], r"temperature=11.0 is invalid"),
    ("--output_dir is a file", lambda t: ["--output_dir", str(_write(t, "f", "x"))], r"--output_dir \S+: is a file"),
    (
        "--output_dir under a file",
        lambda t: ["--output_dir", str(_write(t, "f", "x") / "out")],
        r"--output_dir \S+: \S+/f is a file, so nothing can be created under it",
    ),
    (
        "--output_dir not writable",
        lambda t: ["--output_dir", "/sys/slimrl-test/out"],
        r"--output_dir /sys/slimrl-test/out: cannot write there",
    ),
    (
        "--model path that does not exist",
        lambda t: ["--model", str(t / "no" / "model")],
        r"--model \S+: no such file or directory",
    ),
    ("--model directory without config.json", lambda t: ["--model", str(t)], r"a directory without config.json"),
    ("truncated .gguf", lambda t: ["--model", str(_gguf_prefix(t, 1 << 20))], r"is not a complete GGUF file"),
    ("header-only .gguf", lambda t: ["--model", str(_gguf_prefix(t, 24))], r"is not a complete GGUF file"),
    (
        "prompts longer than max_seq_length - max_completion_length",
        _long_prompts,
        r"2 of 6 prompts are longer than the 56 tokens that --max_seq_length 64 - --max_completion_length 8 leave "
        r"\(longest: 120 tokens, row 0\); pass --truncate_prompts true, --drop_long_prompts true",
    ),
    ("a second run on the same --output_dir", _live_lock, r"another slimrl train \(pid \d+ on .*\) is writing there"),
    (
        "a new run where an earlier one left checkpoints",
        lambda t: [_checkpoint(t / "out", 2) and "--max_steps", "2"],
        r"already holds an earlier run \(checkpoint-2\): continue it with --resume, or pass --overwrite_output_dir "
        r"true",
    ),
    (
        "--resume with a different --lora_r",
        lambda t: [_checkpoint(t / "out", 2, r=8) and "--resume"],
        r"--resume \S+checkpoint-2: the checkpoint is from a different run \(--lora_r 8 there, 16 now\)",
    ),
    (
        "--resume with a different --algorithm",
        lambda t: [_checkpoint(t / "out", 2, algorithm="dpo") and "--resume"],
        r"the checkpoint is from a different run \(--algorithm dpo there, grpo now\)",
    ),
    ("--resume where no checkpoint is intact", lambda t: ["--resume"], r"--resume: no intact checkpoint in"),
    # values that cannot run, refused before the model loads (slimrl/cli/value_checks.py)
    ("--num_generations 10**20", lambda t: ["--num_generations", str(10**20)], r"over 65536, beyond what one machine"),
    ("--gradient_accumulation_steps -1", lambda t: ["--gradient_accumulation_steps", "-1"], r"a count >= 1"),
    ("--per_device_train_batch_size -1", lambda t: ["--per_device_train_batch_size", "-1"], r"a count >= 1"),
    ("--loss_type abc", lambda t: ["--loss_type", "abc"], r"--loss_type abc: GRPOConfig takes grpo"),
    ("--scale_rewards abc", lambda t: ["--scale_rewards", "abc"], r"GRPOConfig takes group, batch, none"),
    ("--generation_kwargs abc", lambda t: ["--generation_kwargs", "abc"], r"a JSON object"),
    ("--top_p -1", lambda t: ["--top_p", "-1"], r"--top_p -1.0: a number in \(0, 1\]"),
    ("--epsilon -1", lambda t: ["--epsilon", "-1"], r"--epsilon -1.0: a number in \[0, 10\]"),
    ("--num_iterations -1", lambda t: ["--num_iterations", "-1"], r"--num_iterations -1: a count >= 1"),
    ("--learning_rate 1e20", lambda t: ["--learning_rate", "1e20"], r"above 1 every step overshoots"),
    ("--save_steps -1", lambda t: ["--save_steps", "-1"], r"--save_steps -1.0: steps between checkpoints"),
    ("--lora_r 10**20", lambda t: ["--lora_r", str(10**20)], r"over 65536"),
    ("--lora_alpha -1", lambda t: ["--lora_alpha", "-1"], r"reverses or erases the adapter's update"),
    ("--lora_dropout -1", lambda t: ["--lora_dropout", "-1"], r"a dropout probability"),
    ("--max_seq_length 10**20", lambda t: ["--max_seq_length", str(10**20)], r"over 16777216"),
    (
        "--train_size 10**20 (the task makes every problem first)",
        lambda t: ["--train_size", str(10**20)],
        r"--train_size \d+: over 10000000",
    ),
    ("--threads 10**20", lambda t: ["--threads", str(10**20)], r"--threads \d+: over 4096"),
    ("--task ''", lambda t: ["--task", ""], r"--task '': the built-in tasks are arithmetic, calculator"),
    ("--output_dir ''", lambda t: ["--output_dir", ""], r"--output_dir '': an empty path"),
    ("--deepspeed a FIFO", lambda t: ["--deepspeed", _fifo(t)], r"not a regular file"),
    (
        "--config with a list where a string goes",
        lambda t: ["--config", str(_write(t, "run.yaml", "dataset: [a, b]\n"))],
        r"key dataset: \['a', 'b'\] is a list",
    ),
    (
        "--config nested 5,000 deep",
        lambda t: ["--config", str(_write(t, "run.yaml", "dataset: " + "[" * 5000 + "]" * 5000 + "\n"))],
        r"nested too deeply",
    ),
    (
        "--config alias bomb",
        lambda t: ["--config", str(_write(t, "run.yaml", _bomb()))],
        r"its aliases expand to more than 100000 values",
    ),
]


@pytest.fixture
def no_model_load(monkeypatch):
    from slimrl.models import fast_language_model

    def boom(*a, **k):
        raise AssertionError("the model was loaded before the input was validated")

    monkeypatch.setattr(fast_language_model.FastLanguageModel, "from_pretrained", staticmethod(boom))


def run_case(tmp: Path, build: Callable[[Path], list[str]], capsys) -> tuple[int, str]:
    argv = build(tmp)
    if "--output_dir" not in argv:
        argv += ["--output_dir", str(tmp / "out")]
    capsys.readouterr()  # what building the case printed is not the CLI's
    code = train.main(argv)
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize(("what", "build", "pattern"), CASES, ids=[c[0] for c in CASES])
def test_case_is_one_line_exit_2_before_the_model_loads(tmp_path, capsys, no_model_load, what, build, pattern):
    code, err = run_case(tmp_path, build, capsys)
    assert code == 2, err
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert re.search(pattern, err), err


def table(tmp_root: Path, capsys) -> str:
    """The README's reliability table: every case, its message (paths shortened) and exit code."""
    rows = ["| case | message (`slimrl train: error: ...`) | exit |", "|---|---|---|"]
    for i, (what, build, _) in enumerate(CASES):
        tmp = tmp_root / f"case{i}"
        tmp.mkdir()
        code, err = run_case(tmp, build, capsys)
        message = err.removeprefix("slimrl train: error: ").replace(str(tmp), "DIR").replace("|", "\\|")
        message = re.sub(r"pid \d+ on [^,]+", "pid N on HOST", message)
        rows.append(f"| {what} | {message} | {code} |")
    return "\n".join(rows)


def test_readme_table_is_current(tmp_path, capsys, no_model_load):
    readme = (ROOT / "docs" / "train.md").read_text()
    assert table(tmp_path, capsys) in readme, (
        "docs/train.md's reliability table is stale: python -m tests.cli.test_reliability"
    )


# ---------------------------------------------------------------- what is kept, taken over or fixed


def test_stale_lock_is_taken_over_with_a_warning(tmp_path):
    from slimrl.cli.outputs import run_lock

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "out"
    out.mkdir()
    (out / ".slimrl.lock").write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename}))
    with pytest.warns(
        UserWarning,
        match=rf"the run that held it \(pid {dead.pid}, .*\) is gone; taking the "
        rf"directory over",
    ):
        with run_lock(out):
            assert json.loads((out / ".slimrl.lock").read_text())["pid"] == os.getpid()
    assert not (out / ".slimrl.lock").exists()


def test_overwrite_clears_the_earlier_run(tmp_path):
    from slimrl.cli.outputs import refuse_earlier_run

    out = tmp_path / "out"
    _checkpoint(out, 2)
    (out / "adapter").mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    (out / "notes.txt").write_text("mine")
    refuse_earlier_run(out, resume=False, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"], "only the run's own files are removed"


def test_damaged_newest_checkpoint_falls_back_to_an_intact_one(tmp_path):
    from slimrl.cli.outputs import pick_checkpoint

    out = tmp_path / "out"
    _checkpoint(out, 2)
    newest = _checkpoint(out, 4)
    data = (newest / "adapter_model.safetensors").read_bytes()
    (newest / "adapter_model.safetensors").write_bytes(data[: len(data) - 8])
    with pytest.warns(
        UserWarning,
        match=r"checkpoint-4 is damaged \(adapter_model.safetensors \(\w+[^)]*\) does not "
        r"load\); trying an older checkpoint",
    ):
        assert pick_checkpoint("latest", out).name == "checkpoint-2"
    opt = out / "checkpoint-2" / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[:-40])
    with pytest.warns(UserWarning), pytest.raises(train.InputError, match="no intact checkpoint"):
        pick_checkpoint("latest", out)


def test_truncate_or_drop_long_prompts(tmp_path):
    from transformers import AutoTokenizer

    from slimrl.cli.args import TrainArguments
    from slimrl.cli.data import fit_prompts

    argv = _long_prompts(tmp_path)
    import datasets

    ds = datasets.load_dataset("json", data_files=argv[argv.index("--dataset") + 1], split="train")
    tok = AutoTokenizer.from_pretrained(str(_tiny_model(tmp_path)))
    targs = TrainArguments(truncate_prompts=True)
    targs.max_seq_length = 64
    cut = fit_prompts(ds, tok, targs, 8, "d")
    assert len(cut) == 8 and max(len(tok(p, add_special_tokens=False).input_ids) for p in cut["prompt"]) <= 56
    targs = TrainArguments(drop_long_prompts=True)
    targs.max_seq_length = 64
    assert len(fit_prompts(ds, tok, targs, 8, "d")) == 6


def test_help_leads_with_config_and_slimrls_options(capsys):
    with pytest.raises(SystemExit) as done:
        train.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    order = [
        text.index(flag)
        for flag in ("--config", "--algorithm", "--lora_r", "--overwrite_output_dir", "--output_dir", "--learning_rate")
    ]
    assert order == sorted(order), "slimrl's options (and --config) must come before TRL's"


def test_threads_follow_the_idle_cores(monkeypatch):
    from slimrl.compat.runtime import threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (1.1, 1.0, 1.0))
    assert threads.choose_threads() == (1, "2 cores available, load 1.1")
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.2, 0.0, 0.0))
    assert threads.choose_threads()[0] == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.choose_threads() == (3, "OMP_NUM_THREADS")
    assert threads.choose_threads(4) == (4, "--threads")


def test_one_cache_copy_per_gguf_content(tmp_path, monkeypatch):
    from slimrl.models import loader

    monkeypatch.setenv("SLIMRL_CACHE", str(tmp_path / "cache"))
    a = _write(tmp_path, "a.gguf", b"GGUF same bytes")
    (tmp_path / "venv2").mkdir()
    b = _write(tmp_path / "venv2", "a.gguf", b"GGUF same bytes")
    c = _write(tmp_path, "c.gguf", b"GGUF other bytes")
    assert loader._gguf_cache_dir(a) == loader._gguf_cache_dir(b) != loader._gguf_cache_dir(c)


def test_a_trainer_built_before_the_patch_is_named_once_at_its_first_step(tmp_path, monkeypatch):
    """PatchFastRL scans nothing (no heap walk, no gc.collect): the trainer built before it says so when it runs
    slimrl's patched step, once; one built after it says nothing."""
    import gc
    import warnings

    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from slimrl import PatchFastRL, unpatch

    pairs = [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}] * 4

    def build(out):
        return DPOTrainer(
            model=tiny_llama(),
            ref_model=tiny_llama(),
            train_dataset=Dataset.from_list(pairs),
            processing_class=tiny_tokenizer(),
            args=DPOConfig(
                output_dir=str(tmp_path / out),
                use_cpu=True,
                bf16=False,
                report_to="none",
                max_steps=2,
                per_device_train_batch_size=2,
                save_strategy="no",
            ),
        )

    early = build("early")
    try:
        walked = []
        real = gc.get_objects
        monkeypatch.setattr(gc, "get_objects", lambda *a, **k: walked.append(1) or real(*a, **k))
        with warnings.catch_warnings(record=True) as at_patch:
            warnings.simplefilter("always")
            PatchFastRL("dpo")
        monkeypatch.undo()
        assert not walked and not [w for w in at_patch if "built before" in str(w.message)]
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            early.train()
            build("late").train()
        said = [str(w.message) for w in seen if "built before" in str(w.message)]
        assert said == [
            "this DPOTrainer was built before PatchFastRL patched its class: it missed slimrl's checks "
            "and hooks at construction but now runs its patched methods (a mix of both); build the "
            "trainer after PatchFastRL"
        ], said
    finally:
        unpatch()


# ---------------------------------------------------------------- real signals and failures (subprocesses)


def _cli(tmp: Path, extra: list[str], env: dict | None = None) -> subprocess.Popen:
    data = _write(tmp, "data.jsonl", "\n".join(json.dumps({"prompt": f"{a}+{a + 1}="}) for a in range(40)))
    argv = [
        "--model",
        str(_tiny_model(tmp)),
        "--dataset",
        str(data),
        "--max_steps",
        "6",
        "--save_steps",
        "3",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "4",
        "--max_completion_length",
        "8",
        "--max_seq_length",
        "64",
        "--eval_size",
        "0",
        "--use_gradient_checkpointing",
        "false",
        "--output_dir",
        str(tmp / "out"),
        "--disable_tqdm",
        "true",
        "--threads",
        "1",
        *extra,
    ]
    # SIGINT back to its default in the child: a suite started in the background (`make test &`) hands its
    # children SIGINT ignored, and the run would then never see the Ctrl-C this file sends it
    return subprocess.Popen(
        [sys.executable, "-m", "slimrl", "train", *argv],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_before_the_first_checkpoint_says_nothing_was_saved(tmp_path, sig):
    proc = _cli(tmp_path, ["--reward", "tests.cli.rewards:digits"], env={"SLIMRL_TEST_REWARD_SLEEP": "30"})
    deadline = time.time() + 120
    while not (tmp_path / "out" / "metrics.jsonl").exists() and time.time() < deadline:  # training has begun
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=240)  # the step in flight ends first (its reward sleeps); slow when loaded
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        "slimrl train: interrupted before the first checkpoint; nothing was saved yet (run again to start over)"
    )
    assert not (tmp_path / "out" / ".slimrl.lock").exists(), "the lock must be released"


def test_reward_error_is_one_line_with_the_traceback_in_a_log(tmp_path):
    proc = _cli(tmp_path, ["--reward", "tests.cli.rewards:broken"])
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("slimrl train: error: reward function 'broken' raised KeyError: 'answer'"), err
    assert "Traceback" not in err
    log = tmp_path / "out" / "slimrl-error.log"
    assert f"(traceback: {log})" in last and "Traceback" in log.read_text()


if __name__ == "__main__":  # regenerate the README table
    import tempfile

    class _Capture:  # the slice of pytest's capsys that run_case uses
        def readouterr(self):
            value = sys.stderr.getvalue()
            sys.stderr.seek(0)
            sys.stderr.truncate()
            return type("R", (), {"err": value})()

    import io

    real = sys.stderr
    sys.stderr = io.StringIO()
    try:
        text = table(Path(tempfile.mkdtemp()), _Capture())
    finally:
        sys.stderr = real
    print(text)
