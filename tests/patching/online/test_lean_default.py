"""slimrl's lean default at a GRPO/RLOO trainer (slimrl/patching/online/lean_default.py): on a GPU, the levers that
buy memory with time (the tiled MLP, the offload of layer inputs) that the user left to slimrl start off and are
applied, cheapest seconds per GiB first, only while the plan's peak is above what fits the budget; the
changed-defaults table says what was applied or taken off. The user's word, a CPU run and a run the planner
cannot plan keep what they had."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

from slimrl.compat import page_lock
from slimrl.compat.model_state import ModelState, attach_state, model_state
from slimrl.compat.page_lock import PageLock
from slimrl.models.tiled_mlp import is_tiled
from slimrl.patching.every_trainer.state import config_state
from slimrl.patching.online.lean_default import _offloader, apply_lean_default
from slimrl.patching.table import PLANNED
from tests.tiny import tiny_llama

# A long-completion run where the MLP's intermediates are most of the backward's recompute.
WIDE = dict(hidden_size=64, intermediate_size=2048, num_hidden_layers=4, max_position_embeddings=8192)
PINS = PageLock(register_error=None, allocates=False, copies_async=True)
REFUSED = PageLock(register_error=712, allocates=False, copies_async=False)


def _bound(completion: int = 2032, checkpointing: bool = True, asked=None, offload=None, budget=None):
    """``offload``: None (no offload), "chosen" (get_peft_model's default) or "asked" (the user's "unsloth")."""
    from peft import LoraConfig, get_peft_model

    from slimrl.models.checkpointing import enable_checkpointing

    model = tiny_llama(**WIDE)
    mode = "slimrl" if offload else checkpointing
    attach_state(model, ModelState(tiled_mlp=asked, checkpointing=mode, checkpointing_chosen=offload == "chosen"))
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    if offload:
        enable_checkpointing(model, "slimrl")
    args = SimpleNamespace(
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=completion,
        gradient_checkpointing=checkpointing,
        beta=0.0,
        use_cpu=False,
        max_seq_length=completion + 16,
        slimrl_memory_budget=budget,
    )  # the prompt: 16 tokens
    return {"model": model, "args": args}


@pytest.fixture
def fake_gpu(fake_gpu, monkeypatch):
    """The presented GPU, with the planner's throughput the nominal one (no CUDA kernel to time here) and the
    page-lock probe's answer ``PINS`` unless a test sets another."""
    from slimrl.compat.gpus import current_gpu
    from slimrl.planning.timing import calibrate, nominal

    def nominal_here(device, dtype, *more, gpu=None):
        return nominal(gpu or current_gpu()) if device == "cuda" else calibrate(device, dtype, *more, gpu=gpu)

    monkeypatch.setattr(importlib.import_module("slimrl.planning.plan"), "calibrate", nominal_here)
    monkeypatch.setattr(page_lock, "probe", lambda device: PINS)
    return fake_gpu


def _peaks(bound, **levers):
    """The plan's (peak, seconds) of the bound run with ``levers`` set."""
    from dataclasses import replace

    from slimrl.patching.online.autofit import settings_of
    from slimrl.planning.plan import plan

    s = settings_of(bound["model"], bound["args"], 16, "grpo", PLANNED["grpo"])
    out = plan(bound["model"].config, replace(s, **levers), search=False)
    return out.peak_bytes


def _budget_for(aim: int) -> str:
    """The ``slimrl_memory_budget`` whose "fits" share is ``aim`` bytes (give or take a KiB)."""
    from slimrl.planning.verdict import fitting_bytes

    lo, hi = aim, 1 << 40
    while hi - lo > 1024:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fitting_bytes(mid, "cuda") < aim else (lo, mid)
    return f"{hi}B"


def _apply(bound):
    apply_lean_default(bound, "grpo", PLANNED["grpo"])
    return is_tiled(bound["model"]), config_state(bound["args"]).changed


@pytest.mark.parametrize("gpu", ["t4", "h100"])
def test_tiles_where_the_untiled_peak_is_above_what_fits_and_the_table_says_so(fake_gpu, gpu):
    fake_gpu(gpu)
    probe = _bound()
    whole, tiled_peak = (
        _peaks(probe, tiled_mlp=False, gradient_checkpointing="true"),
        _peaks(probe, tiled_mlp=True, gradient_checkpointing="true"),
    )
    assert tiled_peak < whole
    tiled, changed = _apply(_bound(budget=_budget_for((whole + tiled_peak) // 2)))
    assert tiled and changed["unsloth_tiled_mlp"][0] is False
    assert changed["unsloth_tiled_mlp"][1].startswith("True (slimrl's default where needed; tiled_mlp: predicted peak")
    assert "s per GiB saved" in changed["unsloth_tiled_mlp"][1]


@pytest.mark.parametrize(
    "bound",
    [
        dict(),  # the card has room: tiles would buy memory the run does not need with time
        dict(asked=False, budget="1MB"),  # the user's word, even where it does not fit
        dict(checkpointing=False, budget="1MB"),  # no recompute to shrink
    ],
)
def test_the_mlps_stay_whole_where_the_default_does_not_apply(fake_gpu, bound):
    fake_gpu("h100")
    tiled, changed = _apply(_bound(**bound))
    assert not tiled and "unsloth_tiled_mlp" not in changed


def test_a_cpu_run_keeps_the_mlps_whole():
    tiled, changed = _apply(_bound(budget="1MB"))
    assert not tiled and not changed


def test_a_model_the_planner_cannot_trace_keeps_its_mlps_whole(fake_gpu, monkeypatch):
    fake_gpu("h100")

    def broken(*_a, **_k):
        raise RuntimeError("no meta trace for this architecture")

    monkeypatch.setattr(importlib.import_module("slimrl.planning.plan"), "plan", broken)
    with pytest.warns(UserWarning, match="could not be planned .* run whole"):
        tiled, changed = _apply(_bound(offload="chosen"))
    assert not tiled and not changed


def _base(bound):
    model = bound["model"]
    return model.get_base_model()


def test_the_default_offload_stays_where_its_copies_cost_nothing(fake_gpu):
    """get_peft_model's default offload on a card with room, host memory pinning: its copies hide behind the compute
    (no predicted time), so it stays and nothing is changed."""
    fake_gpu("h100")
    bound = _bound(offload="chosen")
    tiled, changed = _apply(bound)
    assert _offloader(_base(bound)) is not None and not tiled and "use_gradient_checkpointing" not in changed


def test_the_default_offload_comes_off_where_the_run_fits_and_copies_cost(fake_gpu, monkeypatch):
    """The same card where nothing pins (synchronous copies): the layer inputs stay on the GPU."""
    fake_gpu("h100")
    monkeypatch.setattr(page_lock, "probe", lambda device: REFUSED)
    bound = _bound(offload="chosen")
    assert _offloader(_base(bound)) is not None
    tiled, changed = _apply(bound)
    assert _offloader(_base(bound)) is None and not tiled
    was, now = changed["use_gradient_checkpointing"]
    assert was == "slimrl" and now.startswith("True, layer inputs kept on the GPU (the run fits without the offload")
    assert model_state(bound["model"]).checkpointing is True


def test_where_memory_pins_the_offload_is_the_cheaper_lever(fake_gpu):
    """Both levers left to slimrl and a budget either one meets: the pinned offload (its copies hidden behind the
    compute) costs fewer seconds per GiB than one more MLP forward per layer, so it is the one applied."""
    fake_gpu("h100")
    probe = _bound()
    plain = _peaks(probe, tiled_mlp=False, gradient_checkpointing="true")
    offloaded = _peaks(probe, tiled_mlp=False, gradient_checkpointing="slimrl")
    tiled_peak = _peaks(probe, tiled_mlp=True, gradient_checkpointing="true")
    assert max(offloaded, tiled_peak) < plain
    bound = _bound(offload="chosen", budget=_budget_for((plain + max(offloaded, tiled_peak)) // 2))
    tiled, changed = _apply(bound)
    assert not tiled and "use_gradient_checkpointing" not in changed and _offloader(_base(bound)) is not None


@pytest.mark.parametrize("offload", ["chosen", "asked"])
def test_where_nothing_pins_a_kept_offload_is_said_in_one_line(fake_gpu, monkeypatch, offload):
    fake_gpu("t4")
    monkeypatch.setattr(page_lock, "probe", lambda device: REFUSED)
    bound = _bound(offload=offload, budget="1MB" if offload == "chosen" else None)
    with pytest.warns(UserWarning, match="cudaHostRegister error 712.*the offload is kept") as seen:
        _apply(bound)
    lines = [str(w.message) for w in seen if "cudaHostRegister" in str(w.message)]
    assert len(lines) == 1 and _offloader(_base(bound)) is not None
    assert ("needed to fit" if offload == "chosen" else "use_gradient_checkpointing asked for it") in lines[0]


def test_the_line_comes_where_no_lever_is_left_to_slimrl(fake_gpu, monkeypatch):
    """The user's offload and the user's tiles: nothing to price, and still the one line where memory does not pin."""
    fake_gpu("t4")
    monkeypatch.setattr(page_lock, "probe", lambda device: REFUSED)
    bound = _bound(offload="asked", asked=False)
    with pytest.warns(UserWarning, match="cudaHostRegister error 712.*use_gradient_checkpointing asked for it"):
        tiled, changed = _apply(bound)
    assert not tiled and not changed and _offloader(_base(bound)) is not None


def test_the_users_offload_is_kept_where_the_run_fits(fake_gpu):
    fake_gpu("h100")
    bound = _bound(offload="asked")
    _, changed = _apply(bound)
    assert _offloader(_base(bound)) is not None and "use_gradient_checkpointing" not in changed


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
