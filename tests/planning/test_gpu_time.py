"""A CUDA plan's step time reads the GPU it is made for: the table's dense 16-bit rate and memory bandwidth (not one
H100 for every card), and slimrl's offloaded checkpointing priced by the card's host link (pinned copies hidden
behind the passes' compute, pageable ones synchronous)."""

from __future__ import annotations

import pytest
import torch

from slimrl.compat.gpus import GPUS, find_gpu
from slimrl.planning import timing
from tests.fake_gpu import present

TRAIN = ("policy_forward", "backward")  # the training pass: what `slimrl plan --compare` will time per side


def test_every_gpu_of_the_table_has_its_rates():
    for gpu in GPUS:
        assert 50 <= gpu.dense_tflops <= 2000 and gpu.host_link_gbs in (16, 32, 64), gpu.key
    assert find_gpu("a100").dense_tflops == 312 and find_gpu("t4").dense_tflops == 65  # the datasheets' dense rates


def test_a_plan_for_a_gpu_this_machine_lacks_reads_its_row():
    t4 = timing.calibrate("cuda", torch.float16, gpu=find_gpu("t4"))
    assert t4.flops_per_s == pytest.approx(timing.MATMUL_SHARE * 65e12) and t4.bytes_per_s == pytest.approx(320e9)
    # the default (no --gpu, no CUDA) is the H100 the planner always assumed: those plans are unchanged
    assert timing.calibrate("cuda", torch.bfloat16) == timing.NOMINAL_CUDA
    assert timing.NOMINAL_CUDA.flops_per_s == pytest.approx(0.6 * 989e12)
    assert timing.NOMINAL_CUDA.bytes_per_s == pytest.approx(3.35e12)


def test_on_one_gpu_a_plan_for_another_is_not_measured_on_this_one(monkeypatch):
    present(monkeypatch, "t4")  # a T4 in this machine; the plan is for an H200
    measured = []
    monkeypatch.setattr(timing, "_cache_file", lambda *a: measured.append(a))  # the first step of a measurement
    assert timing.calibrate("cuda", torch.bfloat16, gpu=find_gpu("h200")) == timing.nominal(find_gpu("h200"))
    assert not measured


def _config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
    )


def _plan(gpu: str, **settings):
    from slimrl.planning import Settings, plan

    base = dict(
        device="cuda", gpu=gpu, max_prompt_length=32, max_completion_length=256, tiled_mlp=False, shared_prefix=False
    )
    return plan(_config(), Settings(**{**base, **settings}))


def test_a_t4s_training_pass_takes_longer_than_an_h100s_by_what_bounds_it():
    t4, h100 = (_plan(gpu).step_split for gpu in ("t4", "h100"))
    # the pass model (slimrl.planning.cuda_pass): this tiny shape is bound by its kernel launches, the same count on
    # both cards, so the T4 is slower by much less than its dense rate (65 against 989 TFLOP/s) or bandwidth says
    ratio = sum(t4[k] for k in TRAIN) / sum(h100[k] for k in TRAIN)
    assert 1.05 < ratio < 3350 / 320


def test_offload_copies_hide_behind_compute_when_pinned():
    link = 32e9  # PCIe 4.0 x16
    gb = 10**9
    # 4 GB offloaded, all pinned: 8 GB of copies, 0.25 s, hidden behind 1 s of compute
    assert timing.offload_seconds(4 * gb, 4 * gb, link, overlap_seconds=1.0) == 0.0
    # behind only 0.05 s of compute, 0.2 s show
    assert timing.offload_seconds(4 * gb, 4 * gb, link, overlap_seconds=0.05) == pytest.approx(0.2)
    # nothing pinned: synchronous, at half the link: 8 GB / 16 GB/s
    assert timing.offload_seconds(4 * gb, 0, link, overlap_seconds=1.0) == pytest.approx(0.5)
    assert timing.offload_seconds(0, 0, link, 1.0) == 0.0 and timing.offload_seconds(gb, gb, 0.0, 0.0) == 0.0


def test_a_plan_with_offloaded_checkpointing_prices_its_copies():
    plans = {gpu: _plan(gpu, gradient_checkpointing="slimrl") for gpu in ("t4", "h200")}
    for gpu, p in plans.items():
        assert "offload_copies" in p.step_split and p.step_seconds == pytest.approx(sum(p.step_split.values())), gpu
    offloaded = 4 * 8 * (32 + 256) * 64 * 2  # (layers - 2) x rows x tokens x hidden x 2 bytes (bf16 / fp16)
    hidden = {gpu: sum(p.step_split[k] for k in TRAIN) for gpu, p in plans.items()}
    for gpu, p in plans.items():  # pinned (a few MB): hidden behind the passes' compute up to their length
        link = find_gpu(gpu).host_link_gbs * 1e9
        assert p.step_split["offload_copies"] == pytest.approx(max(0.0, 2 * offloaded / link - hidden[gpu]), rel=0.05)
    assert "offload_copies" not in _plan("h200", gradient_checkpointing="true").step_split


def test_generation_is_priced_as_its_prefill_and_its_decode_with_the_engines_launches():
    """``step_split`` splits generation into prefill and decode. The engine on CUDA replays one graph per decode step
    where HF generate launches every op; over a 4-bit base the engine runs eager and dequantises every weight at every
    step, so its decode is dearer than the 16-bit engine's."""
    from slimrl.planning import Settings, plan

    common = dict(device="cuda", gpu="h100", max_prompt_length=32, max_completion_length=256, tiled_mlp=False)
    hf = plan(_config(), Settings(**common), search=False).step_split
    engine = plan(_config(), Settings(fast_inference=True, **common), search=False).step_split
    four_bit = plan(_config(), Settings(fast_inference=True, load_in_4bit=True, **common), search=False).step_split
    assert "generation" not in hf and hf["generation_prefill"] > 0 and hf["generation_decode"] > 0
    assert engine["generation_prefill"] == pytest.approx(hf["generation_prefill"])
    assert engine["generation_decode"] < hf["generation_decode"]  # graphs: the eager launches gone
    assert four_bit["generation_decode"] > engine["generation_decode"]  # eager, and the dequantised weights
