"""DPO, KTO and SFT on TRL's fused LM head (TRL >= 1.15): patched vs unpatched loss, gradients and metrics.

Every loss type the installed config documents is run, on a full fine-tune of a tiny Llama (the head's weight
gradient is checked too, tied to the embeddings) and, for DPO, through a LoRA adapter (reference = adapter off).
See tests/patching/parity.py for the method and the tolerance.
"""

from __future__ import annotations

import pytest

from slimrl.compat.trl_info import config_choices, trl_version
from tests.patching.parity import PAIRS, assert_parity, first_batch, tiny_model
from tests.tiny import tiny_llama, tiny_tokenizer

pytestmark = pytest.mark.skipif(trl_version().release < (1, 15), reason="TRL < 1.15 has no fused LM head")

COMMON = dict(
    per_device_train_batch_size=4,
    report_to="none",
    use_cpu=True,
    bf16=False,
    save_strategy="no",
    gradient_checkpointing=False,
    max_steps=1,
    seed=3,
)


def _dpo_loss_types() -> list[str]:
    from trl import DPOConfig

    return config_choices(DPOConfig)


def dpo_trainer(tmp_path, lora: bool = False, **cfg):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    model = tiny_model(lora)
    ref = None if lora else tiny_llama(seed=0)  # TRL 1.16 would load the reference from the model's path
    args = DPOConfig(output_dir=str(tmp_path), **{**COMMON, **cfg})
    return DPOTrainer(
        model=model, ref_model=ref, args=args, train_dataset=Dataset.from_list(PAIRS), processing_class=tiny_tokenizer()
    )


@pytest.mark.parametrize("loss_type", _dpo_loss_types())
def test_dpo_parity_every_loss_type(tmp_path, loss_type):
    extra = {"robust": {"label_smoothing": 0.1}, "exo_pair": {"label_smoothing": 1e-3}}.get(loss_type, {})
    metrics = assert_parity(dpo_trainer(tmp_path, loss_type=[loss_type], **extra), "dpo")
    assert metrics, "TRL logged no metrics"


def test_dpo_parity_lora_wpo_weighting_and_ld_alpha(tmp_path):
    """LoRA (reference = adapter disabled), WPO weights (``log_sum_sq_probs``) and LD-DPO's length split."""
    assert_parity(dpo_trainer(tmp_path, lora=True, use_weighting=True, ld_alpha=0.5), "dpo")


def test_dpo_parity_combined_losses(tmp_path):
    assert_parity(dpo_trainer(tmp_path, loss_type=["sigmoid", "sft"], loss_weights=[1.0, 0.5]), "dpo")


@pytest.mark.parametrize("loss_type", ["kto", "apo_zero_unpaired"])
def test_kto_parity_every_loss_type(tmp_path, loss_type):
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    rows = [
        {"prompt": r["prompt"], "completion": r[k], "label": k == "chosen"}
        for r in PAIRS
        for k in ("chosen", "rejected")
    ]
    args = KTOConfig(output_dir=str(tmp_path), loss_type=loss_type, **COMMON)
    trainer = KTOTrainer(
        model=tiny_llama(seed=0),
        ref_model=tiny_llama(seed=0),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tiny_tokenizer(),
    )
    assert_parity(trainer, "kto")


def _sft_loss_types() -> list[str]:
    from trl import SFTConfig

    return [t for t in config_choices(SFTConfig) if t != "chunked_nll"]  # chunked_nll: TRL's own non-fused path


@pytest.mark.parametrize("loss_type", _sft_loss_types())
@pytest.mark.parametrize("completion_only", [True, False])
def test_sft_parity_every_loss_type(tmp_path, loss_type, completion_only):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    rows = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in PAIRS]
    args = SFTConfig(output_dir=str(tmp_path), loss_type=loss_type, completion_only_loss=completion_only, **COMMON)
    trainer = SFTTrainer(
        model=tiny_llama(seed=0), args=args, train_dataset=Dataset.from_list(rows), processing_class=tiny_tokenizer()
    )
    assert_parity(trainer, "sft")


def test_num_chunks_sets_the_fused_head_chunking(tmp_path, monkeypatch):
    """``unsloth_num_chunks`` / ``unsloth_logit_chunk_multiplier`` on a fused-head trainer's config reach the kernel
    (training and evaluation), and an explicit value selects slimrl's kernel even where TRL's Triton kernel would
    run; the loss stays TRL's (same tolerance as above)."""
    import torch

    from slimrl import PatchFastRL, unpatch
    from slimrl.patching.routes import fused_head, head

    seen = []
    real = head.chunked_logprob_outputs

    def spy(hidden, *args, **kwargs):
        seen.append((hidden.size(0), kwargs["num_chunks"], kwargs["chunk_multiplier"]))
        return real(hidden, *args, **kwargs)

    monkeypatch.setattr(head, "chunked_logprob_outputs", spy)  # where every route projects
    trainer = dpo_trainer(tmp_path, per_device_eval_batch_size=4)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train's loop; the steps run here by hand
    inputs = first_batch(trainer)
    torch.manual_seed(0)
    ref = float(trainer.training_step(trainer.model, dict(inputs)))
    PatchFastRL("dpo")
    try:
        trainer.args.unsloth_num_chunks = 3  # what DPOConfig(unsloth_num_chunks=3) sets while patched
        trainer.model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        loss = float(trainer.training_step(trainer.model, dict(inputs)))
        assert seen and all(chunks == 3 for _, chunks, _ in seen), seen
        assert abs(loss - ref) <= 1e-4 * abs(ref)
        seen.clear()
        trainer.prediction_step(trainer.model, dict(inputs), prediction_loss_only=True)
        assert seen and all(chunks == 3 for _, chunks, _ in seen), "evaluation ignored the config"

        monkeypatch.setattr(fused_head, "_trl_kernel_is_best", lambda device: True)  # a CUDA device with Triton
        seen.clear()
        trainer.args.unsloth_num_chunks = -1
        trainer.training_step(trainer.model, dict(inputs))
        assert not seen, "automatic chunking must leave TRL's Triton kernel in place"
        trainer.args.unsloth_logit_chunk_multiplier = 2
        trainer.training_step(trainer.model, dict(inputs))
        assert seen and all(mult == 2 for _, _, mult in seen), "an explicit setting must select slimrl's kernel"
    finally:
        unpatch()


def _sft_trainer(tmp_path):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    rows = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in PAIRS]
    args = SFTConfig(output_dir=str(tmp_path), completion_only_loss=True, **COMMON)
    return SFTTrainer(
        model=tiny_llama(seed=0), args=args, train_dataset=Dataset.from_list(rows), processing_class=tiny_tokenizer()
    )


@pytest.mark.parametrize("name", ["sft", "dpo"])
def test_a_batch_with_every_token_masked_takes_trls_step(tmp_path, name):
    """No token in the loss (SFT: every label -100; DPO: every completion mask 0, as a length cut leaves them): the
    fused head's kernel gets no row, and the step is TRL's (loss, zero gradients, metrics), never a tensor without
    a graph."""
    import torch

    from slimrl import unpatch
    from tests.patching.parity import both_sides

    trainer = _sft_trainer(tmp_path) if name == "sft" else dpo_trainer(tmp_path, lora=True)
    unpatch()
    inputs = first_batch(trainer)
    if "labels" in inputs:
        inputs["labels"] = torch.full_like(inputs["labels"], -100)
    if "completion_mask" in inputs:
        inputs["completion_mask"] = torch.zeros_like(inputs["completion_mask"])
    (ref_loss, ref_grads, ref_metrics), (loss, grads, metrics) = both_sides(trainer, name, inputs)
    assert loss == pytest.approx(ref_loss, rel=1e-6, abs=1e-7)
    assert grads.keys() == ref_grads.keys() and ref_grads
    assert all(float(g.abs().max()) == 0.0 for g in grads.values())
    assert metrics.keys() == ref_metrics.keys()
    for key, ref in ref_metrics.items():
        assert metrics[key] == pytest.approx(ref, rel=1e-4, abs=1e-4, nan_ok=True), key
