"""The shared-prefix layout (:mod:`slimrl.patching.routes.shared_prefix`): GRPO with each prompt computed once per
group equals TRL alone — same sampled completions, same logged losses, same parameter updates after two steps — on
Llama-, Qwen2-, Qwen3- and Gemma3-style tiny models, with prompts of different lengths in one batch (different left
padding), natural (mixed) completion lengths, beta > 0, old log-probs (``num_iterations=2``), groups split across
micro-batches and gradient checkpointing, generation's prefill shared (:mod:`slimrl.generation.shared_prefill`: TRL
alone samples the same completions); and the fallbacks (eager attention, a binding sliding window, the field
off) run TRL's layout with one log line.

Tolerance: relative error <= 1e-4 on updates and losses (fp32; the packed forward sums attention over the same keys
in a different grouping, ~1e-7 relative per op, accumulated over 2 layers, the backward and 2 steps)."""

from __future__ import annotations

import logging

import pytest
import torch

from slimrl.patching.every_trainer.state import trainer_state
from tests.patching.parity import assert_patched_equals_unpatched
from tests.tiny import NARROW, tiny_tokenizer

PROMPTS = ["1+2=", "13+4=", "5+126=", "7=", "40+5+6="]  # five lengths: five left paddings


def _model(family: str, attn: str = "sdpa", **overrides):
    from transformers import AutoConfig

    from slimrl.verify.tiny import build

    fields = dict(
        vocab_size=49,
        hidden_size=NARROW["hidden_size"],
        intermediate_size=NARROW["intermediate_size"],
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    if family in ("qwen3", "gemma3_text"):
        fields["head_dim"] = 8
    if family == "gemma3_text":
        fields.update(sliding_window=64, layer_types=["sliding_attention", "full_attention"])
    fields.update(overrides)
    config = AutoConfig.for_model(family, **fields)
    config._attn_implementation = attn
    model = build(config, seed=0)
    model.generation_config.eos_token_id = 1
    return model


def run_online(
    out, family="llama", attn="sdpa", model_overrides=None, algorithm="grpo", policy=None, built=None, **cfg
):
    """Two steps of ``algorithm`` (GRPO or RLOO, SGD) on a LoRA policy (``policy``, else PEFT's LoRA on
    :func:`_model`; ``built(trainer)`` runs after the trainer is built); (completions seen, updates, losses,
    trainer)."""
    import trl
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model

    model = policy
    if model is None:
        model = _model(family, attn, **(model_overrides or {}))
        torch.manual_seed(1)
        model = get_peft_model(
            model,
            LoraConfig(
                r=4,
                lora_alpha=8,
                target_modules=["q_proj", "v_proj", "up_proj"],
                init_lora_weights=False,
                task_type="CAUSAL_LM",
            ),
        )
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    seen: list[list[str]] = []

    def reward_digits(completions, **kwargs):
        seen.append(list(completions))
        return [float(sum(ch.isdigit() for ch in c)) for c in completions]

    args = dict(
        output_dir=str(out),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=10,
        max_steps=2,
        num_iterations=2,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        beta=0.04,
        temperature=0.9,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        logging_steps=1,
        seed=7,
        gradient_checkpointing=False,
        disable_dropout=True,
        **({"loss_type": "dapo"} if algorithm == "grpo" else {}),
    )
    args.update(cfg)
    name = algorithm.upper()
    trainer = getattr(trl, f"{name}Trainer")(
        model=model,
        args=getattr(trl, f"{name}Config")(**args),
        reward_funcs=[reward_digits],
        processing_class=tiny_tokenizer(),
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS * 2]),
    )
    if built is not None:
        built(trainer)
    trainer.train()
    deltas = {n: p.detach() - before[n] for n, p in model.named_parameters() if p.requires_grad}
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return seen, deltas, losses, trainer


def _parity(tmp_path, **kwargs):
    algorithm = kwargs.get("algorithm", "grpo")
    return assert_patched_equals_unpatched(lambda out: run_online(out, **kwargs), algorithm, tmp_path)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gemma3_text"])
def test_packed_rows_equal_trl_alone(tmp_path, family):
    trainer = _parity(tmp_path, family=family)
    assert trainer_state(trainer).shared_prefix_forwards > 0, "the shared-prefix layout was not used"
    assert trainer_state(trainer).shared_prefills > 0, "generation's prefill was not shared"


def test_groups_split_across_micro_batches_with_checkpointing(tmp_path):
    """2 rows per micro-batch, 4 completions per prompt (each group in two calls), TRL's gradient checkpointing:
    the layers recomputed in the backward get the layout again."""
    trainer = _parity(
        tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=2, gradient_checkpointing=True
    )
    assert trainer_state(trainer).shared_prefix_forwards > 0


@pytest.mark.parametrize(
    "case,expected",
    [
        (dict(attn="eager"), "attention implementation 'eager'"),
        (dict(family="gemma3_text", model_overrides=dict(sliding_window=4)), "a sliding window of 4 tokens"),
    ],
)
def test_fallback_runs_trl_layout_with_one_line(tmp_path, caplog, case, expected):
    from slimrl.patching.routes import shared_prefix

    shared_prefix._SAID.clear()
    with caplog.at_level(logging.INFO, logger="slimrl"):
        trainer = _parity(tmp_path, **case)
    assert trainer_state(trainer).shared_prefix_forwards == 0
    lines = [r.getMessage() for r in caplog.records if "shared-prefix layout off" in r.getMessage()]
    assert len(lines) == 1 and expected in lines[0], lines


def test_field_off_runs_trl_layout_silently(tmp_path, caplog):
    from slimrl import PatchFastRL, unpatch

    PatchFastRL("grpo")
    try:
        with caplog.at_level(logging.INFO, logger="slimrl"):
            _, _, _, trainer = run_online(tmp_path, slimrl_shared_prefix=False, max_steps=1)
    finally:
        unpatch()
    assert trainer_state(trainer).served_calls > 0 and trainer_state(trainer).shared_prefix_forwards == 0
    assert trainer_state(trainer).shared_prefills == 0
    assert not [r for r in caplog.records if "shared-prefix" in r.getMessage() or "shared prefill" in r.getMessage()]


def test_rloo_packed_rows_equal_trl_alone(tmp_path):
    """RLOO (before TRL 1.15 through the method-capture route, from 1.15 beside TRL's fused head): same sampled
    completions, losses and updates as TRL alone (beta > 0, mixed lengths, five left paddings), generation's prefill
    shared though RLOO generates with the model in training mode (nothing in it draws random numbers)."""
    trainer = _parity(tmp_path, family="qwen2", algorithm="rloo", num_iterations=1)
    assert trainer_state(trainer).shared_prefix_forwards > 0, "the shared-prefix layout was not used"
    assert trainer_state(trainer).shared_prefills > 0, "generation's prefill was not shared"


def _slimrl_policy(path, checkpointing, **load):
    from slimrl import FastLanguageModel

    model, _ = FastLanguageModel.from_pretrained(str(path), max_seq_length=256, **load)
    return FastLanguageModel.get_peft_model(
        model,
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj", "up_proj"],
        init_lora_weights=False,
        random_state=1,
        use_gradient_checkpointing=checkpointing,
    )


@pytest.mark.parametrize("setting", ["offloaded checkpointing", "selective checkpointing", "4-bit"])
def test_layout_with_slimrl_loading_equals_trl_layout(tmp_path, setting):
    """A policy loaded by ``FastLanguageModel`` with slimrl's activation checkpointing (offloaded; selective, every
    second layer) or a 4-bit base: the layout on equals it off (TRL's rows, proven equal to TRL alone above) —
    same completions, losses and updates (1e-4 relative, fp32). 4-bit: the base computes in fp32 here (its weights
    dequantized in every forward, the same numbers on both sides) and the adapter, which TRL casts to bf16 on a
    quantized base, is put back in fp32 on both sides, so that bf16 storage rounding (one ulp of a weight is ~10 % of
    an update here) does not hide the layout's own error."""
    from slimrl import PatchFastRL, unpatch
    from slimrl.verify.relative_error import worst_parameter_error

    path = tmp_path / "tiny"
    _model("llama", hidden_size=64, intermediate_size=128).save_pretrained(path)  # 4-bit packs rows in blocks of 32
    tiny_tokenizer().save_pretrained(path)
    load, checkpointing, cfg = {}, "slimrl", dict(gradient_checkpointing=True)

    def adapter_in_fp32(trainer):
        for p in trainer.model.parameters():
            if p.requires_grad:
                p.data = p.data.float()

    if setting == "selective checkpointing":
        checkpointing = "selective"
    elif setting == "4-bit":
        pytest.importorskip("bitsandbytes", minversion="0.50")
        load, checkpointing = dict(load_in_4bit=True, dtype=torch.float32), False
        cfg = dict(gradient_checkpointing=False, built=adapter_in_fp32)
    PatchFastRL("grpo")
    try:
        off = run_online(
            tmp_path / "off", policy=_slimrl_policy(path, checkpointing, **load), slimrl_shared_prefix=False, **cfg
        )
        on = run_online(tmp_path / "on", policy=_slimrl_policy(path, checkpointing, **load), **cfg)
    finally:
        unpatch()
    rtol = 1e-4
    assert trainer_state(on[3]).shared_prefix_forwards > 0 and trainer_state(off[3]).shared_prefix_forwards == 0
    assert on[0] == off[0], "the layout changed the sampled completions"
    assert any(d.abs().max() > 0 for d in off[1].values()), "no update: the test would be vacuous"
    worst, name = worst_parameter_error(on[1], off[1])
    assert worst <= rtol, f"{name}: relative error {worst:.2e}"
    assert on[2] == pytest.approx(off[2], rel=rtol, abs=1e-6)


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_generation_runs_in_mallocs_recycling_phase(tmp_path, monkeypatch, algorithm):
    """Both online trainers' ``_generate_single_turn`` (slimrl.patching.online.prefill) run in the recycling phase,
    with the layout on or off (RLOO's generation outside it measured +45 % on the CPU)."""
    from contextlib import contextmanager

    from slimrl import PatchFastRL, unpatch
    from slimrl.patching.online import prefill

    entered = []

    @contextmanager
    def recording():
        entered.append(1)
        yield

    monkeypatch.setattr(prefill, "recycling_phase", recording)
    PatchFastRL(algorithm)
    try:
        run_online(tmp_path / "on", algorithm=algorithm, max_steps=1, num_iterations=1)
        on = len(entered)
        run_online(tmp_path / "off", algorithm=algorithm, max_steps=1, num_iterations=1, slimrl_shared_prefix=False)
    finally:
        unpatch()
    assert on > 0 and len(entered) > on
