"""TRL alone simulated on the meta device (:mod:`slimrl.planning.baseline`) and ``slimrl plan --compare``
(:mod:`slimrl.planning.compare`): the simulation holds what each TRL head holds (logits-sized tensors before 1.15,
the fused head's fp32 weight gradient after), the optimizer state and reference model as TRL keeps them, and the
comparison puts slimrl's prediction beside it."""

from __future__ import annotations

import json

import pytest

from slimrl.planning.baseline import family_of, liger_chunk, simulate

GIB = 2**30


def _work(name: str):
    """The trainer's workload as its module declares it (with TRL alone's step), from the trainer table."""
    from slimrl.patching.table import PLANNED

    return PLANNED[name]


def _config(vocab: int = 4096, hidden: int = 64, layers: int = 2, **more):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        **{"max_position_embeddings": 1 << 17, "tie_word_embeddings": True, **more},
    )


def test_families_follow_the_trl_release():
    assert family_of("1.14.2") == "full_logits" and family_of("1.15.0") == "fused_head"
    assert family_of("1.16.0") == "fused_head" and family_of("1.16.0", liger=True) == "liger"


def test_full_logits_hold_logit_sized_tensors_the_fused_head_does_not():
    """TRL <= 1.14's GRPO pass holds the logits and their gradient at once, both fp32: accelerate's mixed precision
    converts the model's outputs to fp32 (``convert_outputs_to_fp32``), so the kernel's gradient is fp32 too (two
    fp32 [T, V] tensors at least; the bf16 ones would be half that). TRL >= 1.15's fused head stays far below one
    of them (its tile is [4096, 32768] whatever the length)."""
    config, tokens = _config(vocab=32768), 16384
    logits = tokens * 32768 * 4  # fp32 [T, V]
    full = simulate(config, _work("grpo"), tokens, "full_logits")
    fused = simulate(config, _work("grpo"), tokens, "fused_head")
    assert full.pass_peak >= 2 * logits
    assert fused.pass_peak < logits / 4
    assert full.persistent == fused.persistent  # the head changes the step, not what is held across steps


def test_sft_nll_before_1_15_also_upcasts_the_logits():
    """transformers' own loss (SFT's nll before 1.15) upcasts the logits to fp32: bf16 + fp32 copies at least."""
    config, tokens = _config(vocab=32768), 2048
    logits = tokens * 32768 * 2
    assert simulate(config, _work("sft"), tokens, "full_logits").pass_peak >= 3 * logits


def test_the_reference_outputs_and_the_logit_metrics_stay_live_until_the_loss_returns():
    """TRL <= 1.14's KTO keeps ``ref_outputs`` referenced until ``_compute_loss`` returns, and its logits metrics
    copy the chosen and the rejected rows of the policy's logits (``index_select``, both held) and then each half's
    positions by a boolean mask: policy + reference + both copies + one masked half, 3.5 fp32 [2, T, V] tensors at
    once (the backward holds 2.5). DPO's metrics split by views and mask one half at a time."""
    config, tokens = _config(vocab=32768), 4096
    logits = 2 * tokens * 32768 * 4  # fp32 [2, T, V]
    kto = simulate(config, _work("kto"), tokens, "full_logits", rows=2)
    assert kto.pass_peak >= 3.5 * logits
    dpo = simulate(config, _work("dpo"), tokens, "full_logits")  # policy and reference [2, T, V] each, one masked half
    assert dpo.pass_peak >= 2.5 * logits
    no_reference = simulate(config, _work("kto"), tokens, "full_logits", rows=2, reference=False)
    assert kto.pass_peak - no_reference.pass_peak >= logits  # the reference's logits held, not freed at once


def test_fused_head_backward_holds_an_fp32_weight_gradient_when_the_head_trains():
    """Full fine-tuning trains the (tied) head: the fused head's backward holds an fp32 [V, H] gradient; with LoRA
    the head is frozen and that gradient is never allocated."""
    config = _config(vocab=65536, hidden=256)
    full = simulate(config, _work("sft"), 256, "fused_head")
    lora = simulate(config, _work("sft"), 256, "fused_head", lora_r=8)
    assert full.pass_peak - lora.pass_peak >= 65536 * 256 * 4


def test_optimizer_state_reference_and_lora():
    import torch

    config = _config()
    full = simulate(config, _work("rloo"), 256, "fused_head")
    weights = full.persistent["weights"]
    assert full.persistent["optimizer"] == 2 * weights  # AdamW's two moments in the weights' dtype (bf16)
    # RLOO's default beta keeps a frozen copy, built by create_model_from_path in its default float32
    assert full.persistent["reference"] == 2 * weights
    bf16 = simulate(config, _work("rloo"), 256, "fused_head", reference_dtype=torch.bfloat16)
    assert bf16.persistent["reference"] == weights  # model_init_kwargs={"dtype": "bfloat16"}
    four_bit = simulate(config, _work("rloo"), 256, "fused_head", load_in_4bit=True)
    assert four_bit.persistent["reference"] == four_bit.persistent["weights"]  # rebuilt 4-bit
    lora = simulate(config, _work("rloo"), 256, "fused_head", lora_r=8)
    assert "reference" not in lora.persistent  # the adapter disabled is the reference
    from slimrl.planning.trace import meta_model

    adapter = sum(p.numel() for n, p in meta_model(config, torch.bfloat16, 8).named_parameters() if "lora_" in n)
    assert lora.persistent["optimizer"] == 16 * adapter  # fp32 adapter weights, gradients and two moments
    assert "reference" not in simulate(config, _work("grpo"), 256, "fused_head").persistent  # beta 0 by default


def test_sliding_window_masks_are_quadratic_on_cuda():
    """A sliding-window layer gets a boolean [T, T] mask that CUDA's memory-efficient kernel turns into a bias of
    the query's dtype: the pass grows with T^2 on CUDA, not in the CPU simulation."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(
        "gemma3_text",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        vocab_size=512,
        sliding_window=64,
        max_position_embeddings=1 << 16,
    )
    config._attn_implementation = "sdpa"
    t = 2048

    def growth(device: str) -> int:  # what doubling the length adds beyond twice the memory: the T^2 terms x 2
        one, two = (simulate(config, _work("grpo"), n, "fused_head", device=device).pass_peak for n in (t, 2 * t))
        return two - 2 * one

    assert growth("cuda") >= 5 * t * t  # (1 + 2) T^2 bytes: the bool mask and the bf16 bias, x (4 - 2)
    assert growth("cpu") < 3 * t * t  # the bool mask only


def test_liger_chunk_and_bad_input():
    assert liger_chunk(8192, 262144, 1152) == 64  # 8192 / ceil(262144 / 1152) = 35.9 -> 64
    with pytest.raises(ValueError, match="pass a trainer's Workload with its TRL step"):
        simulate(_config(), "ppo", 64, "fused_head")  # a name: the step is the trainer's own declaration
    with pytest.raises(ValueError, match="choose from"):
        simulate(_config(), _work("grpo"), 64, "tiles")


@pytest.mark.slow  # minutes of searches on 2 cores: make test-full runs it
def test_compare_puts_slimrl_beside_trl_alone(tmp_path):
    from slimrl.planning.compare import compare
    from slimrl.planning.settings import Settings

    config = _config(vocab=32768, hidden=128)
    from slimrl.patching.table import PLANNED

    s = Settings(
        workload=PLANNED["grpo"],
        per_device_train_batch_size=2,
        num_generations=2,
        max_prompt_length=32,
        max_completion_length=512,
        lora_r=8,
        device="cuda",
        gradient_checkpointing="true",
    )
    from slimrl.compat.gpus import CUDA_CONTEXT_BYTES
    from slimrl.planning.verdict import FITS_BELOW

    sides = compare(config, s, budget=CUDA_CONTEXT_BYTES + int(GIB / 4 / FITS_BELOW), step=1024)
    assert {"slimrl", "trl"} <= set(sides)
    assert sides["trl"]["phases"]["generation"] == sides["slimrl"]["phases"]["generation"]
    assert all(side["longest_completion"] for side in sides.values())
    with pytest.raises(ValueError, match="orpo"):
        compare(config, Settings(algorithm="orpo", workload=PLANNED["orpo"]))


def test_plan_cli_compare(capsys, tmp_path):
    from slimrl.cli import plan as plan_cli

    _config(vocab=8192).save_pretrained(tmp_path)
    base = [
        "--model",
        str(tmp_path),
        "--device",
        "cuda",
        "--max_completion_length",
        "128",
        "--lora_r",
        "4",
        "--per_device_train_batch_size",
        "2",
        "--num_generations",
        "2",
    ]
    assert plan_cli.main([*base, "--compare", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["compare"]["trl"]["peak_bytes"] > 0 and data["compare"]["slimrl"]["peak_bytes"] == data["peak_bytes"]
    assert plan_cli.main([*base, "--compare"]) == 0
    out = capsys.readouterr().out
    assert "compared" in out and "peak / TRL alone" in out
    assert plan_cli.main([*base, "--compare", "--algorithm", "orpo"]) == 2  # one line: TRL alone is not simulated
    assert "--compare" in capsys.readouterr().err


def test_slimrl_plan_counts_the_reference_trl_builds():
    """slimrl leaves the reference to TRL: its plan of a full fine-tuning DPO run on CUDA counts the float32 copy,
    on CPU (fp32 weights) the weights' own size."""
    from slimrl.patching.table import PLANNED
    from slimrl.planning import Settings, plan

    s = Settings(
        algorithm="dpo",
        workload=PLANNED["dpo"],
        lora_r=0,
        per_device_train_batch_size=1,
        num_generations=1,
        max_prompt_length=8,
        max_completion_length=8,
    )
    cuda = plan(_config(), Settings(**{**s.__dict__, "device": "cuda"}), search=False).phases
    cpu = plan(_config(), s, search=False).phases
    assert cuda["reference"] == 2 * cuda["weights"] and cpu["reference"] == cpu["weights"]
