"""Patched vs unpatched TRL GRPOTrainer: same completions, same loss, same LoRA updates.

Each case trains two GRPO steps from the same seed twice in one test, first with TRL alone, then after
``PatchFastRL("grpo")`` (and ``unpatch`` afterwards). The optimizer is plain SGD so the update is proportional to
the gradient (Adam's first step, ``lr * g / |g|``, would hide gradient errors), and the LoRA adapter starts with
random A and B (``init_lora_weights=False``) so both receive gradient on the first step. ``num_iterations=2``
makes TRL compute old log-probs (the no-grad pass) and beta > 0 the reference pass.

Tolerance: relative error <= 1e-4 on the parameter updates (fp32: the two paths sum the vocabulary in different
orders and chunks, ~1e-6 relative per op, accumulated over a 2-layer backward and 2 steps).
"""

from __future__ import annotations

import pytest
import torch

from slimrl import PatchFastRL, unpatch
from slimrl.compat.trl_info import grpo_loss_types
from slimrl.patching.every_trainer.state import trainer_state
from slimrl.patching.routes import served
from tests.patching.parity import assert_patched_equals_unpatched
from tests.tiny import tiny_llama, tiny_tokenizer

LOSS_TYPES = grpo_loss_types()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


def run_grpo(tmp_path, loss_type: str, beta: float, tiled_rows: int | None = None, **cfg_overrides):
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from trl import GRPOConfig, GRPOTrainer

    tok = tiny_tokenizer()
    model = tiny_llama(seed=0)
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
    if tiled_rows:  # from_pretrained(unsloth_tiled_mlp=tiled_rows) does this
        from slimrl.models.tiled_mlp import tile_mlp

        tile_mlp(model, rows=tiled_rows)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    seen: list[list[str]] = []

    def reward_digits(completions, **kwargs):
        seen.append(list(completions))
        return [float(sum(ch.isdigit() for ch in c)) for c in completions]

    ds = Dataset.from_list([{"prompt": p} for p in ["1+2=", "3+4=", "5+6=", "7+8="]])
    kwargs = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=12,
        max_steps=2,
        num_iterations=2,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        beta=beta,
        loss_type=loss_type,
        temperature=0.9,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        logging_steps=1,
        seed=7,
        gradient_checkpointing=False,
        disable_dropout=True,
    )
    if loss_type == "luspo":
        kwargs["importance_sampling_level"] = "sequence"
    kwargs.update(cfg_overrides)
    trainer = GRPOTrainer(
        model=model, args=GRPOConfig(**kwargs), reward_funcs=[reward_digits], train_dataset=ds, processing_class=tok
    )
    trainer.train()
    deltas = {n: p.detach().cpu() - before[n] for n, p in model.named_parameters() if p.requires_grad}  # [*p.shape]
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return seen, deltas, losses, trainer


def check_parity(tmp_path, loss_type, beta, **overrides):
    return assert_patched_equals_unpatched(lambda out: run_grpo(out, loss_type, beta, **overrides), "grpo", tmp_path)


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_grpo_patched_equals_trl(tmp_path, loss_type, beta):
    """Every loss type x beta, each micro-batch one prompt's group: through the shared-prefix layout (the default)."""
    trainer = check_parity(tmp_path, loss_type, beta)
    metrics = trainer.state.log_history[0]
    assert metrics["memory/peak_mb"] > 0 and metrics["tokens_per_s"] > 0
    assert trainer_state(trainer).shared_prefix_forwards > 0


def test_entropy_bonus_and_entropy_mask_parity(tmp_path):
    """The entropy carries gradient (entropy_coef > 0) and drives the high-entropy token mask."""
    from trl import GRPOConfig

    if "entropy_coef" not in GRPOConfig.__dataclass_fields__:
        pytest.skip("this TRL has no entropy bonus")
    check_parity(tmp_path, "dapo", 0.04, entropy_coef=0.1, top_entropy_quantile=0.5)


def test_gradient_checkpointing_and_num_chunks_parity(tmp_path):
    """TRL's default checkpointing on both sides; slimrl with a fixed chunk count (a config field only the
    patched GRPOConfig accepts)."""
    unpatch()
    _, ref_deltas, _, _ = run_grpo(tmp_path / "trl", "grpo", 0.04, gradient_checkpointing=True)
    PatchFastRL("grpo")
    try:
        _, deltas, _, _ = run_grpo(tmp_path / "slim", "grpo", 0.04, gradient_checkpointing=True, unsloth_num_chunks=3)
    finally:
        unpatch()
    for name, ref in ref_deltas.items():
        assert _rel(deltas[name], ref) <= 1e-4


def test_tiled_mlp_run_equals_trl_alone(tmp_path, monkeypatch):
    """``unsloth_tiled_mlp``: slimrl with every MLP tiled (tiles of 8 tokens, checkpointed inside TRL's layer
    checkpointing, LoRA on up_proj) vs TRL alone untiled: same completions, updates within the same 1e-4."""
    from slimrl.models import tiled_mlp

    tiles = []
    monkeypatch.setattr(
        tiled_mlp,
        "checkpoint",
        lambda fn, x, **kw: tiles.append(x.shape[0]) or torch.utils.checkpoint.checkpoint(fn, x, **kw),
    )
    unpatch()
    ref_seen, ref_deltas, _, _ = run_grpo(tmp_path / "trl", "dapo", 0.04, gradient_checkpointing=True)
    assert not tiles
    PatchFastRL("grpo")
    try:
        seen, deltas, _, trainer = run_grpo(tmp_path / "slim", "dapo", 0.04, tiled_rows=8, gradient_checkpointing=True)
    finally:
        unpatch()
    assert seen == ref_seen and served(trainer) > 0
    assert len(tiles) > 4 and max(tiles) == 8  # the backward's passes ran tile by tile
    assert any(d.abs().max() > 0 for n, d in ref_deltas.items() if "up_proj" in n)
    for name, ref in ref_deltas.items():
        assert _rel(deltas[name], ref) <= 1e-4, name


def test_unsupported_head_delegates_to_trl(tmp_path, monkeypatch):
    """Heads slimrl must not bypass (LoRA on the head, ZeRO-3, quantized) go through TRL's own method: the run
    still equals TRL alone and the capture route is not used. From TRL 1.15 that method runs TRL's fused head,
    whose kernel is slimrl's (labelled positions only; 1e-4 as every kernel parity test); before, TRL's full
    logits (1e-6: the same code on both sides)."""
    from slimrl.compat.trl_info import has_fused_head
    from slimrl.patching.routes import method_capture

    unpatch()
    _, ref_deltas, _, _ = run_grpo(tmp_path / "trl", "dapo", 0.04)
    monkeypatch.setattr(method_capture, "plain_linear_head", lambda model: None)
    captured = []
    real = method_capture._logps_through_ops
    monkeypatch.setattr(method_capture, "_logps_through_ops", lambda *a, **k: captured.append(1) or real(*a, **k))
    PatchFastRL("grpo")
    try:
        _, deltas, _, trainer = run_grpo(tmp_path / "slim", "dapo", 0.04)
    finally:
        unpatch()
    assert not captured
    assert (served(trainer) > 0) == has_fused_head()  # slimrl's kernel inside TRL's method, where TRL has one
    for name, ref in ref_deltas.items():
        assert _rel(deltas[name], ref) <= (1e-4 if has_fused_head() else 1e-6)


def test_fp16_model_with_fp16_flag_parity(tmp_path, monkeypatch):
    """The T4/V100 flow (an fp16 model, ``fp16=True`` as ``fp16=not is_bfloat16_supported()`` writes): patched
    equals TRL alone. Tolerance 1e-2, verify's for fp16 (11 mantissa bits; the two paths round the logits' matmul
    differently); measured 8e-4. On a CPU accelerate runs fp16 autocast without a loss scaler (the scaler is CUDA's);
    slimrl's autograd nodes pass a scaled gradient through linearly either way."""
    import tests.patching.trainers.test_grpo as this

    real = this.tiny_llama
    monkeypatch.setattr(this, "tiny_llama", lambda seed=0, **kw: real(seed=seed, **kw).to(torch.float16))
    assert_patched_equals_unpatched(lambda out: run_grpo(out, "dapo", 0.04, fp16=True), "grpo", tmp_path, rtol=1e-2)
