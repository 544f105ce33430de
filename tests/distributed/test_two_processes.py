"""Distributed training through slimrl's patches: `accelerate launch` of 2 processes (CPU, gloo), DDP and FSDP2.

(Skipped on machines with CUDA, where `--multi_gpu` would put both ranks on GPUs.)

Two ranks train one patched GRPO step on different prompts. If the patched log-prob path bypassed the
DDP-wrapped model, DDP would not all-reduce the LoRA gradients and the ranks would end with different weights
(or DDP would fail on unused parameters). The test asserts identical weights on both ranks, a real update, that
the ranks saw different data (so equality is not a coincidence of identical batches), and that the result equals
one process training on the same global batch (generation is made deterministic in the worker so both runs see
the same completions; tolerance 1e-4 relative on the update: fp32, gradients summed in a different order by
the all-reduce).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    shutil.which("accelerate", path=str(Path(sys.executable).parent)) is None,
    reason="accelerate CLI not installed next to this python",
)
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU/gloo variant of the test")
@pytest.mark.parametrize(
    "config, port",
    [
        ("two_processes.yaml", 29517),  # DDP in `make test`, the rest in test-full
        pytest.param("fsdp2.yaml", 29518, marks=pytest.mark.slow),
        pytest.param("deepspeed_zero2.yaml", 29519, marks=pytest.mark.slow),
        pytest.param("deepspeed_zero3.yaml", 29520, marks=pytest.mark.slow),
    ],
)
def test_two_process_grpo_step_keeps_ranks_in_sync(tmp_path, config, port):
    """DDP, FSDP2 (parameters sharded as DTensors; slimrl's log-prob path reads the sharded head with
    ``full_tensor()``), DeepSpeed ZeRO-2, and ZeRO-3 (the head partitioned: slimrl leaves the log-prob pass to TRL's
    own path), each launched with the shipped config of ``examples/accelerate/``; each rank's micro-batch holds one
    prompt twice, so the log-prob passes take the shared-prefix layout (not under ZeRO-3)."""
    if config.startswith("deepspeed"):
        pytest.importorskip("deepspeed", reason="slimrl[deepspeed] not installed in this environment")
    accelerate = str(Path(sys.executable).parent / "accelerate")
    engine = {"two_processes.yaml": "MULTI_GPU", "fsdp2.yaml": "FSDP"}.get(config, "DEEPSPEED")
    # MULTI_GPU is accelerate's torchrun launcher; without CUDA its processes train on CPU over gloo (`--cpu` with 2
    # processes would start a single process: accelerate's multi-CPU path is mpirun). FSDP2 and DeepSpeed on a CPU
    # need the worker's lift of accelerate's accelerator-only rule (grpo_worker.lift_accelerator_only_rule).
    cmd = [
        accelerate,
        "launch",
        "--config_file",
        str(ROOT / "examples/accelerate" / config),
        "--main_process_port",
        str(port),
        str(ROOT / "tests/distributed/grpo_worker.py"),
        str(tmp_path),
    ]
    cmd += ["--sharded"] if engine != "MULTI_GPU" else []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    info = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(i["world_size"] == 2 for i in info)
    expected = "MULTI_CPU" if engine == "MULTI_GPU" else engine  # without the lift, a CPU group is MULTI_CPU
    assert all(i["engine"] == expected for i in info), info  # the engine the config asks for ran
    assert all(i["dtensor"] == (engine == "FSDP") for i in info), info
    zero3 = config == "deepspeed_zero3.yaml"
    assert all(i["zero3_head"] == zero3 for i in info), info
    if zero3:  # the partitioned head only exists inside its own forward: TRL's path computed the log-probs
        assert all(i["slimrl_tokens"] == 0 for i in info), info
    else:
        assert all(i["slimrl_tokens"] > 0 for i in info), "slimrl's log-prob path did not run on every rank"
        assert all(i["shared_prefix_forwards"] > 0 for i in info), "the shared-prefix layout did not run on every rank"
    assert sorted(info[0]["prompts"]) != sorted(info[1]["prompts"]), "both ranks saw the same prompts"
    w0, w1 = (load_file(str(tmp_path / f"rank{r}.safetensors")) for r in (0, 1))
    assert w0.keys() == w1.keys() and w0
    for name in w0:
        assert torch.equal(w0[name], w1[name]), f"{name} differs between ranks: gradients were not all-reduced"

    # the step changed the adapter (a no-op step would make the equality vacuous) ...
    from peft import LoraConfig, get_peft_model

    from tests.tiny import tiny_llama

    model = tiny_llama(seed=0)
    torch.manual_seed(1)
    model = get_peft_model(
        model,
        LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False, task_type="CAUSAL_LM"
        ),
    )
    start = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    assert all((w0[n] - start[n]).abs().max() > 0 for n in w0), "the step did not update every LoRA matrix"

    # ... and the same global batch in one process gives the same update
    single = subprocess.run(
        [sys.executable, str(ROOT / "tests/distributed/grpo_worker.py"), str(tmp_path), "--single"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
    one = json.loads((tmp_path / "ranksingle.json").read_text())
    assert sorted(one["prompts"]) == sorted(info[0]["prompts"] + info[1]["prompts"]), "different global batch"
    ws = load_file(str(tmp_path / "ranksingle.safetensors"))
    for name in w0:
        d2, d1 = w0[name] - start[name], ws[name] - start[name]
        rel = float((d2 - d1).norm() / d1.norm())
        assert rel <= 1e-4, f"{name}: update with 2 processes vs 1 process, relative difference {rel:.2e}"


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("accelerate", path=str(Path(sys.executable).parent)) is None,
    reason="accelerate CLI not installed next to this python",
)
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU/gloo variant of the test")
@pytest.mark.parametrize("algorithm, port", [("orpo", 29521), ("cpo", 29522)])
def test_two_process_fsdp2_preference_step_equals_trl(tmp_path, algorithm, port):
    """ORPO and CPO (the score-positions route, which reads the LM head itself: an FSDP2-sharded head is gathered
    with ``full_tensor()`` by :class:`slimrl.patching.routes.head.Head`) under ``examples/accelerate/fsdp2.yaml``:
    slimrl's route ran on both ranks, the ranks end equal, and the adapter update equals TRL alone's under the same
    launch; ORPO's also equals one process training on the same global batch (CPO's does not, with TRL alone
    either: its NLL term is a per-process token mean). Tolerance 1e-4 relative: fp32, gradients reduced in
    another order."""
    from tests.distributed.preference_worker import start_weights

    accelerate = str(Path(sys.executable).parent / "accelerate")
    worker = str(ROOT / "tests/distributed/preference_worker.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

    def launch(out: Path, *flags: str) -> list[dict]:
        cmd = [
            accelerate,
            "launch",
            "--config_file",
            str(ROOT / "examples/accelerate/fsdp2.yaml"),
            "--main_process_port",
            str(port),
            worker,
            algorithm,
            str(out),
            *flags,
        ]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]

    info = launch(tmp_path / "slimrl")
    assert all(i["world_size"] == 2 and i["engine"] == "FSDP" and i["dtensor"] and i["head_dtensor"] for i in info), (
        info
    )
    assert all(i["served"] > 0 for i in info), "slimrl's score-positions route did not run on every rank"
    assert all(i["served"] == 0 for i in launch(tmp_path / "trl", "--trl-alone"))
    start = start_weights()
    w0, w1 = (load_file(str(tmp_path / "slimrl" / f"rank{r}.safetensors")) for r in (0, 1))
    refs = {"TRL alone, 2 processes": load_file(str(tmp_path / "trl" / "rank0.safetensors"))}
    if algorithm == "orpo":
        single = subprocess.run(
            [sys.executable, worker, algorithm, str(tmp_path / "one"), "--single"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
        refs["1 process"] = load_file(str(tmp_path / "one" / "ranksingle.safetensors"))
    assert w0.keys() == start.keys() and w0
    for name in w0:
        assert torch.equal(w0[name], w1[name]), f"{name} differs between ranks"
        for what, ref in refs.items():
            d2, d1 = w0[name] - start[name], ref[name] - start[name]
            assert d1.abs().max() > 0, f"{name}: no update in {what} (the comparison would be vacuous)"
            rel = float((d2 - d1).norm() / d1.norm())
            assert rel <= 1e-4, f"{name}: update vs {what}, relative difference {rel:.2e}"
