"""The CUDA training-pass model (slimrl/planning/cuda_pass.py): its two fitted constants reproduce the lease rows
they were fitted on, each kernel choice moves the time the way its bytes or FLOPs say, and ``--compare`` reports
each side's training seconds."""

from __future__ import annotations

import pytest

from slimrl.compat.gpus import find_gpu
from slimrl.planning import cuda_pass
from slimrl.planning.cuda_pass import SLIMRL, TRL, TRL_LIGER, Kernels, train_seconds

LEASE = dict(rows=8, generations=8, prompt=256, completion=4096, lora_r=64, recompute=1.0)


@pytest.fixture(scope="module")
def qwen():
    import importlib.util
    from pathlib import Path

    from transformers import AutoConfig

    path = Path(__file__).resolve().parents[2] / "bench" / "gpu_shapes.py"  # the lease's shapes
    spec = importlib.util.spec_from_file_location("gpu_shapes", path)
    shapes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shapes)
    values = dict(shapes.SHAPES["qwen2.5-1.5b"])
    return AutoConfig.for_model(values.pop("model_type"), **values)


def _total(config, gpu="h200", **kw):
    return sum(train_seconds(config, find_gpu(gpu), **{**LEASE, **kw}).values())


def test_the_fitted_constants_reproduce_the_rows_they_were_fitted_on(qwen):
    """H200, the first lease (docs/BENCHMARKS.md "GPU"): TRL alone 1.44 s, TRL + Liger 1.20 s. Two rows, two
    constants: this pins the fit (a change to the model's terms must refit them), it does not validate it."""
    assert (cuda_pass.EW_SHARE, cuda_pass.GEMM_SHARE) == (0.70, 0.84)
    assert _total(qwen, kernels=TRL) == pytest.approx(1.44, rel=0.01)
    assert _total(qwen, kernels=TRL_LIGER) == pytest.approx(1.20, rel=0.01)


def test_each_kernel_choice_moves_the_time_its_way(qwen):
    base = _total(qwen, kernels=TRL)
    assert _total(qwen, kernels=Kernels(liger=True)) < base  # one pass over each tensor for norm, rotary, SwiGLU
    assert _total(qwen, kernels=Kernels(fused_lora=True)) < base  # no fp32 copy of each adapted input
    assert _total(qwen, kernels=Kernels(logits=False)) < base  # no [N, V] fp32 logits read and written
    assert _total(qwen, kernels=Kernels(repeat_kv=False)) < base
    prefix = _total(qwen, kernels=SLIMRL, shared_prefix=True)
    assert prefix < _total(qwen, kernels=SLIMRL)  # 7 of 8 copies of the 256 prompt tokens not computed
    assert _total(qwen, kernels=SLIMRL, tiled=True) > _total(qwen, kernels=SLIMRL)  # one more MLP forward
    assert _total(qwen, kernels=TRL, recompute=0.0) < base  # no recompute
    assert _total(qwen, gpu="t4", kernels=TRL) > 10 * base  # 65 dense TFLOP/s and 320 GB/s against 989 and 4,800


def test_compare_reports_each_sides_training_seconds_on_cuda(tmp_path):
    from transformers import LlamaConfig

    from slimrl.patching.table import PLANNED
    from slimrl.planning import Settings
    from slimrl.planning.compare import compare

    config = LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip
    common = dict(workload=PLANNED["grpo"], max_prompt_length=16, max_completion_length=48, lora_r=4)
    sides = compare(config, Settings(device="cuda", gpu="h100", **common))
    for name in ("trl", "slimrl"):
        split = sides[name]["train_split"]
        assert sides[name]["train_seconds"] == pytest.approx(sum(split.values()), abs=1e-5)
        assert set(split) >= {"gemm", "attention", "head", "elementwise", "launches"} and split["launches"] > 0
    assert "train_seconds" not in compare(config, Settings(device="cpu", **common))["trl"]


def test_the_shared_prefix_layout_pays_where_the_prompts_outweigh_its_own_traffic(qwen):
    """The lease's shape: 8 completions of 4,096 tokens sharing a 256-token prompt stop repeating 1,792 prompt tokens,
    more than the layout's gathers and launches cost; a 16-token prompt saves 112 and does not pay."""
    from slimrl.planning.cuda_pass import shared_prefix_pays

    h200 = find_gpu("h200")
    kernels = cuda_pass.slimrl_kernels(True)
    split = train_seconds(qwen, h200, kernels=kernels, shared_prefix=True, **LEASE)
    assert split["prefix"] > 0 and "prefix" not in train_seconds(qwen, h200, kernels=kernels, **LEASE)
    assert shared_prefix_pays(qwen, h200, kernels, **LEASE)
    assert not shared_prefix_pays(qwen, h200, kernels, **{**LEASE, "prompt": 16})


def test_the_plan_takes_the_layout_on_cuda_only_where_it_pays(qwen):
    from slimrl.planning import Settings
    from slimrl.planning.phases import shared_prefix_applies

    run = dict(per_device_train_batch_size=8, num_generations=8, max_completion_length=4096, lora_r=64, gpu="h200")
    for device, prompt, takes in (("cuda", 256, True), ("cuda", 16, False), ("cpu", 16, True)):
        assert shared_prefix_applies(qwen, Settings(device=device, max_prompt_length=prompt, **run)) is takes


@pytest.mark.parametrize("prompt, takes", [(256, True), (16, False)])
def test_a_gpu_call_takes_the_layout_only_where_it_pays(qwen, monkeypatch, prompt, takes):
    from types import SimpleNamespace

    import torch

    from slimrl.patching.routes import shared_prefix
    from tests.models.test_fused_lora import _model

    trainer = SimpleNamespace(model=_model("qwen2"), args=SimpleNamespace(gradient_checkpointing=True))
    rows = SimpleNamespace(input_ids=torch.zeros(8, prompt + 4096), facts=SimpleNamespace(lengths=[4096] * 8))
    assert shared_prefix.pays(trainer, qwen, rows, [list(range(8))], prompt) is takes
