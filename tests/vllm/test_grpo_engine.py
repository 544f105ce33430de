"""TRL's GRPOTrainer generating through the fast_inference engine (real SmolLM2-135M, vLLM's CPU build).

One run (8 steps) serves every check: ``use_vllm`` switched on and shown, TRL's
generation object is slimrl's, one adapter sync per optimizer step (new id each), TRL's own importance-sampling
metric shows the engine's sampled-token log-probs equal the training model's at every step (so the sync happened
before each generation), ``vllm_sampling_params`` reaches the engine, phase peaks are logged, and the reward on
the built-in arithmetic task rises as it does on the HF-generate path.
"""

from __future__ import annotations

import pytest
import torch

from slimrl.generation import vllm_status
from slimrl.patching.every_trainer.state import config_state, trainer_state

pytestmark = pytest.mark.skipif(vllm_status() is not None, reason=f"vLLM not usable here: {vllm_status()}")

STEPS = 8


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from slimrl import FastLanguageModel, PatchFastRL, unpatch, vLLMSamplingParams
    from slimrl.data import correctness_reward, format_reward, make_arithmetic_dataset

    PatchFastRL("grpo", FastLanguageModel)
    try:
        from trl import GRPOConfig, GRPOTrainer

        model, tok = FastLanguageModel.from_pretrained(
            "SmolLM2-135M-Instruct",
            max_seq_length=256,
            dtype=torch.float32,
            fast_inference=True,
            max_lora_rank=16,
            gpu_memory_utilization="auto",
        )
        model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=32, use_gradient_checkpointing=False)
        cfg = GRPOConfig(
            output_dir=str(tmp_path_factory.mktemp("grpo")),
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=32,
            max_steps=STEPS,
            learning_rate=5e-4,
            lr_scheduler_type="constant",
            beta=0.0,
            temperature=0.8,
            seed=3407,
            report_to="none",
            use_cpu=True,
            bf16=False,
            save_strategy="no",
            logging_steps=1,
            vllm_sampling_params=vLLMSamplingParams(max_tokens=28, n=4),
        )
        with pytest.warns(UserWarning, match="n=4 is ignored"):
            trainer = GRPOTrainer(
                model=model,
                args=cfg,
                train_dataset=make_arithmetic_dataset(128),
                processing_class=tok,
                reward_funcs=[correctness_reward, format_reward],
            )
        no_grad_calls = []
        method = trainer._get_per_token_logps_and_entropies

        def counted(*args, **kwargs):
            if not torch.is_grad_enabled():
                no_grad_calls.append(1)  # beta=0: no reference pass; TRL's old-log-prob pass would be one per step
            return method(*args, **kwargs)

        trainer._get_per_token_logps_and_entropies = counted
        trainer.train()
        del trainer._get_per_token_logps_and_entropies
        trainer.no_grad_calls = len(no_grad_calls)
        yield trainer, model
    finally:
        unpatch()


def test_trainer_generates_through_the_engine(run, capsys):
    from slimrl.generation.trl_backend import SlimrlVLLMGeneration

    trainer, model = run
    assert trainer.args.use_vllm and trainer.use_vllm
    assert config_state(trainer.args).changed["use_vllm"][1].startswith("True")
    assert isinstance(trainer.vllm_generation, SlimrlVLLMGeneration)
    engine = model.vllm_engine
    assert engine.adapter_id == STEPS and engine.timings["syncs"] == STEPS  # one sync per optimizer step
    assert engine.lora_request.lora_int_id == STEPS
    sampling = trainer.vllm_generation.sampling
    assert sampling["max_tokens"] == 28 and sampling["n"] == 1
    assert sampling["temperature"] == 0.8  # from the trainer


def test_engine_logprobs_match_training_model_at_every_step(run):
    trainer, _ = run
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == STEPS
    # TRL's own metric: |training-model log-prob - engine log-prob| of every sampled token, fp32 both sides.
    # (No top_p/top_k here: the engine reports processed log-probs, i.e. after truncation, which TRL's training-side
    # log-probs do not apply; its importance-sampling ratio then corrects for that, as intended.)
    for h in logs:
        assert h["sampling/sampling_logp_difference/mean"] < 1e-3, h
        assert 0.99 < h["sampling/importance_sampling_ratio/mean"] < 1.01, h
        assert h["completions/max_length"] <= 28  # vllm_sampling_params(max_tokens=28) reached the engine
        assert h["memory/generation_peak_mb"] > 100 and h["engine/sync_s"] > 0
    assert all("memory/training_peak_mb" in h for h in logs[1:])


def test_reward_rises_through_the_engine(run):
    trainer, _ = run
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    half = len(rewards) // 2  # per-step rewards of 8 completions are noisy: compare halves
    first, last = sum(rewards[:half]) / half, sum(rewards[half:]) / (len(rewards) - half)
    assert last > first + 0.1, rewards


def test_no_old_log_prob_pass_and_the_same_loss_as_trls_pass(run):
    """Old-log-prob reuse with the real engine: the run skipped TRL's no-grad old-log-prob pass at every
    step (IS metrics still logged, above), and on one fresh generation batch the loss, gradients and IS ratio from
    the policy forward equal TRL's branch (its pass run on the same batch). Tolerance: relative 1e-4 (fp32; the
    pass and the policy forward are the same forward, batched the same, measured ~1e-6)."""
    from slimrl import PatchFastRL
    from slimrl.patching.online.old_logps import _Window

    trainer, model = run
    PatchFastRL("grpo")  # every test ends unpatched (conftest); the trainer's class methods are patched again
    assert trainer.no_grad_calls == 0
    trainer.model.train()
    raw = next(iter(trainer.get_train_dataloader()))
    trainer.args.slimrl_reuse_old_logps = False
    try:
        batch = trainer._generate_and_score_completions(raw)  # TRL's branch: its pass, its IS ratio
    finally:
        trainer.args.slimrl_reuse_old_logps = True
    assert "old_per_token_logps" in batch and "importance_sampling_ratio" in batch

    def loss_and_grads(inputs):
        model.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(model, inputs)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    trl_loss, trl_grads = loss_and_grads(dict(batch))
    mine = {k: v for k, v in batch.items() if k not in ("old_per_token_logps", "importance_sampling_ratio")}
    trainer_state(trainer).is_window = _Window(micro_batches=1)
    loss, grads = loss_and_grads(mine)
    assert torch.allclose(mine["importance_sampling_ratio"], batch["importance_sampling_ratio"], rtol=1e-4, atol=1e-6)
    assert abs(float(loss - trl_loss)) <= 1e-4 * max(abs(float(trl_loss)), 1e-3)
    assert trl_grads and grads.keys() == trl_grads.keys()
    for name, g in trl_grads.items():
        assert float((grads[name] - g).norm() / g.norm().clamp(min=1e-12)) <= 1e-4, name


def test_the_engine_run_logs_its_mismatch_and_it_is_small(run):
    trainer, _ = run
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert all(h["sampling/kl_k3/mean"] < 1e-4 and h["sampling/is_masked_share/sequence"] == 0.0 for h in logs), [
        h["sampling/kl_k3/mean"] for h in logs
    ]  # fp32 engine and trainer, adapter synced every step


def test_truncated_sampling_through_the_engine_is_corrected_by_the_field(run, tmp_path):
    """top_p=0.8 through the real engine: its processed log-probs are renormalised over the kept tokens; with
    slimrl_truncated_sampling_fix the trainer's side is too, so the raw ratio's mean stays at 1 (without the fix it
    is the kept mass, ~0.9: docs/BENCHMARKS.md's sampler rows)."""
    from trl import GRPOConfig, GRPOTrainer

    from slimrl import PatchFastRL
    from slimrl.data import correctness_reward, make_arithmetic_dataset

    PatchFastRL("grpo")  # every test ends unpatched (conftest)
    _, model = run
    tok = run[0].processing_class
    cfg = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=24,
        max_steps=2,
        learning_rate=5e-4,
        beta=0.0,
        temperature=0.8,
        top_p=0.8,
        seed=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        logging_steps=1,
        slimrl_truncated_sampling_fix=True,
    )
    trainer = GRPOTrainer(
        model=model,
        args=cfg,
        train_dataset=make_arithmetic_dataset(32),
        processing_class=tok,
        reward_funcs=[correctness_reward],
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    for h in logs:
        assert h["sampling/raw_importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=0.01), h
        assert h["sampling/kl_k3/mean"] < 1e-3


@pytest.mark.parametrize(
    "case", ["all_truncated_masked", pytest.param("all_rows_masked_by_is", marks=pytest.mark.slow)]
)
def test_degenerate_batches_through_the_engine_take_trls_step(run, tmp_path, case):
    """Nothing to learn from, generated by the engine: every completion cut at 2 tokens and masked
    (``mask_truncated_completions``, Unsloth's Gemma 4 notebook), or every sequence masked by TRL's
    importance-sampling correction (ratios ~1 below ``clip_min=1.5``). TRL's step there is loss 0 and no update;
    slimrl's must be the same, without "element 0 of tensors does not require grad"."""
    from trl import GRPOConfig, GRPOTrainer

    from slimrl import PatchFastRL
    from slimrl.data import correctness_reward, make_arithmetic_dataset

    PatchFastRL("grpo")  # every test ends unpatched (conftest)
    _, model = run
    extra = (
        {"max_completion_length": 2, "mask_truncated_completions": True}
        if case == "all_truncated_masked"
        else {
            "max_completion_length": 8,
            "vllm_importance_sampling_mode": "sequence_mask",
            "vllm_importance_sampling_clip_min": 1.5,
            "vllm_importance_sampling_clip_max": None,
        }
    )
    cfg = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_generations=4,
        max_steps=1,
        learning_rate=5e-4,
        beta=0.0,
        temperature=0.8,
        seed=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        logging_steps=1,
        **extra,
    )
    trainer = GRPOTrainer(
        model=model,
        args=cfg,
        train_dataset=make_arithmetic_dataset(16),
        processing_class=run[0].processing_class,
        reward_funcs=[correctness_reward],
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer.train()
    (h,) = [h for h in trainer.state.log_history if "loss" in h]
    assert abs(h["loss"]) < 1e-6, h
    if case == "all_truncated_masked":
        assert h["completions/clipped_ratio"] == 1.0, h
    assert all(torch.equal(p.detach(), before[n]) for n, p in model.named_parameters() if p.requires_grad)
