"""slimrl's tiled-MLP default at a GRPO/RLOO trainer (slimrl/patching/online/lean_default.py): on a GPU, where the
user gave no ``unsloth_tiled_mlp``, the model's MLPs are tiled when the plan says it saves >= 10 % of the peak, and
the changed-defaults table says so; the user's word, a CPU run and a short run keep the MLPs whole."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

from slimrl.compat.model_state import ModelState, attach_state, model_state
from slimrl.models.tiled_mlp import is_tiled
from slimrl.patching.every_trainer.state import config_state
from slimrl.patching.online.lean_default import apply_lean_default
from slimrl.patching.table import PLANNED
from tests.tiny import tiny_llama

# A long-completion run where the MLP's intermediates are most of the backward's recompute.
WIDE = dict(hidden_size=64, intermediate_size=2048, num_hidden_layers=4, max_position_embeddings=8192)


def _bound(completion: int = 2032, checkpointing: bool = True, asked=None):
    from peft import LoraConfig, get_peft_model

    model = tiny_llama(**WIDE)
    if asked is not None:
        attach_state(model, ModelState(tiled_mlp=asked))
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    args = SimpleNamespace(
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=completion,
        gradient_checkpointing=checkpointing,
        beta=0.0,
        use_cpu=False,
        max_seq_length=completion + 16,
    )  # the prompt: 16 tokens
    return {"model": model, "args": args}


@pytest.fixture
def fake_gpu(fake_gpu, monkeypatch):
    """The presented GPU, with the planner's throughput the nominal one (no CUDA kernel to time here; the decision
    is about memory)."""
    from slimrl.compat.gpus import current_gpu
    from slimrl.planning.timing import calibrate, nominal

    def nominal_here(device, dtype, *more, gpu=None):
        return nominal(gpu or current_gpu()) if device == "cuda" else calibrate(device, dtype, *more, gpu=gpu)

    monkeypatch.setattr(importlib.import_module("slimrl.planning.plan"), "calibrate", nominal_here)
    return fake_gpu


def _apply(bound):
    apply_lean_default(bound, "grpo", PLANNED["grpo"])
    return is_tiled(bound["model"]), config_state(bound["args"]).changed


@pytest.mark.parametrize("gpu", ["t4", "h100"])
def test_a_long_run_on_a_gpu_gets_tiles_and_the_table_says_so(fake_gpu, gpu):
    fake_gpu(gpu)
    tiled, changed = _apply(_bound())
    assert tiled and changed["unsloth_tiled_mlp"][0] is False
    assert changed["unsloth_tiled_mlp"][1].startswith("True (tiled MLP (slimrl's default")


@pytest.mark.parametrize(
    "bound",
    [
        dict(asked=False),  # the user's word
        dict(completion=48),  # short: tiles save < 10 %
        dict(checkpointing=False),  # no recompute to shrink
    ],
)
def test_the_mlps_stay_whole_where_the_default_does_not_apply(fake_gpu, bound):
    fake_gpu("h100")
    tiled, changed = _apply(_bound(**bound))
    assert not tiled and "unsloth_tiled_mlp" not in changed


def test_a_cpu_run_keeps_the_mlps_whole():
    tiled, changed = _apply(_bound())
    assert not tiled and not changed


def test_a_model_the_planner_cannot_trace_keeps_its_mlps_whole(fake_gpu, monkeypatch):
    fake_gpu("h100")

    def broken(*_a, **_k):
        raise RuntimeError("no meta trace for this architecture")

    monkeypatch.setattr(importlib.import_module("slimrl.planning.plan"), "plan", broken)
    with pytest.warns(UserWarning, match="could not be planned .* run whole"):
        tiled, changed = _apply(_bound())
    assert not tiled and not changed


def test_the_trainer_init_runs_the_default_before_auto_fit(grpo_patched, tmp_path, monkeypatch):
    """The patched GRPOTrainer's constructor calls the default with its arguments (a CPU run here: no tiles)."""
    import slimrl.patching.online.lean_default as lean

    seen = []
    monkeypatch.setattr(
        lean,
        "apply_lean_default",
        lambda bound, algorithm, workload: seen.append((sorted(k for k in bound if k in ("model", "args")), algorithm)),
    )
    from tests.patching.online.test_autofit import _trainer

    _trainer(tmp_path, tiny_llama(), max_completion_length=8)
    assert seen == [(["args", "model"], "grpo")]


def test_from_pretrained_records_the_users_word(tiny_model_dir):
    from slimrl import FastLanguageModel

    for given, expected in (({}, None), ({"unsloth_tiled_mlp": False}, False), ({"unsloth_tiled_mlp": 512}, 512)):
        model, _ = FastLanguageModel.from_pretrained(str(tiny_model_dir), max_seq_length=64, **given)
        assert model_state(model).tiled_mlp == expected and is_tiled(model) is bool(expected)


def test_auto_fit_on_a_gpu_takes_the_card_and_leaves_the_margin_to_the_verdict(fake_gpu):
    """Auto-fit's CUDA budget is the card as ``slimrl plan --gpu`` takes it (what this process holds counted as
    available, the context included): the verdict keeps the allocator's margin, not a second 10 %."""
    from slimrl.compat.gpus import find_gpu
    from slimrl.patching.online.autofit import default_budget

    gpu = fake_gpu("l4")
    gpu.place(3 * 2**30)  # this process's model
    assert default_budget("cuda") == find_gpu("l4").total_bytes
