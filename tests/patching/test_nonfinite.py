"""The NaN/inf stop on the other trainers' training_step (GRPO's is in tests/test_bad_input.py)."""

from __future__ import annotations

import pytest
import torch

from slimrl import PatchFastRL, unpatch
from tests.tiny import tiny_llama, tiny_tokenizer

PAIRS = [{"prompt": f"{a}+1=", "chosen": str(a + 1), "rejected": str(a + 2)} for a in range(4)]


def test_dpo_nan_step_is_stopped_before_the_update(tmp_path):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from slimrl.patching.every_trainer.nonfinite import NonFiniteStepError

    model = tiny_llama()
    PatchFastRL("dpo")
    try:
        trainer = DPOTrainer(
            model=model,
            ref_model=tiny_llama(),
            train_dataset=Dataset.from_list(PAIRS),
            processing_class=tiny_tokenizer(),
            args=DPOConfig(
                output_dir=str(tmp_path),
                per_device_train_batch_size=2,
                max_steps=2,
                report_to="none",
                use_cpu=True,
                bf16=False,
                save_strategy="no",
                gradient_checkpointing=False,
            ),
        )
        model.model.norm.register_forward_hook(lambda m, a, out: out * float("nan") if torch.is_grad_enabled() else out)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(
            NonFiniteStepError,
            match=r"step 1: the loss is nan; the update was not applied.*no "
            r"checkpoint was written yet",
        ):
            trainer.train()
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "weights changed"
    finally:
        unpatch()


def test_every_trainer_refuses_an_empty_dataset(tmp_path):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer

    PatchFastRL()
    try:
        for trainer_cls, config_cls in ((DPOTrainer, DPOConfig), (KTOTrainer, KTOConfig)):
            with pytest.raises(ValueError, match="train_dataset is empty: pass a dataset with at least one row"):
                trainer_cls(
                    model=tiny_llama(),
                    args=config_cls(output_dir=str(tmp_path), use_cpu=True, bf16=False),
                    train_dataset=Dataset.from_list([]),
                    processing_class=tiny_tokenizer(),
                )
    finally:
        unpatch()


def test_rloo_reward_function_errors_are_named(tmp_path):
    from datasets import Dataset
    from trl import RLOOConfig, RLOOTrainer

    def bad_length(completions, **kwargs):
        return [0.0]

    PatchFastRL("rloo")
    try:
        trainer = RLOOTrainer(
            model=tiny_llama(),
            reward_funcs=[bad_length],
            train_dataset=Dataset.from_list([{"prompt": "1+2="}] * 4),
            processing_class=tiny_tokenizer(),
            args=RLOOConfig(
                output_dir=str(tmp_path),
                per_device_train_batch_size=2,
                num_generations=2,
                max_completion_length=4,
                max_steps=1,
                beta=0.0,
                report_to="none",
                use_cpu=True,
                bf16=False,
                save_strategy="no",
                gradient_checkpointing=False,
            ),
        )
        with pytest.raises(ValueError, match=r"reward function 'bad_length' returned 1 values for 2 completions"):
            trainer.train()
    finally:
        unpatch()


def _reward_run(tmp_path, patched: bool, **cfg):
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    from tests.tiny import tiny_llama_scorer

    pairs = [{"chosen": f"{a}+1={a + 1}", "rejected": f"{a}+1={a + 2}"} for a in range(16)]
    if patched:
        PatchFastRL("reward")
    try:
        model = tiny_llama_scorer().to(torch.float16)
        trainer = RewardTrainer(
            model=model,
            train_dataset=Dataset.from_list(pairs),
            processing_class=tiny_tokenizer(),
            args=RewardConfig(
                output_dir=str(tmp_path),
                use_cpu=True,
                bf16=False,
                max_steps=8,
                learning_rate=0.1,
                per_device_train_batch_size=2,
                report_to="none",
                save_strategy="no",
                logging_steps=1,
                **cfg,
            ),
        )
        trainer.train()
        return trainer.state.log_history
    finally:
        if patched:
            unpatch()


def test_fp16_weights_overflow_is_left_to_trl(tmp_path):
    """TRL's own Reward test trains a float16 model at learning rate 0.1: the weights overflow and TRL completes
    the run. The guard must not stop what TRL completes (it warns once)."""
    plain = _reward_run(tmp_path / "trl", patched=False)
    assert any(row.get("grad_norm") != row.get("grad_norm") for row in plain), "no overflow: the test is vacuous"
    with pytest.warns(RuntimeWarning, match=r"non-finite loss or gradients with float16 weights"):
        ours = _reward_run(tmp_path / "slimrl", patched=True)
    assert [r.get("loss") for r in ours[:-1]] == [r.get("loss") for r in plain[:-1]]


class _Scaler:
    def is_enabled(self):
        return True


def _fake_trainer(scaler=None, skipped=False, step=0):
    from collections import defaultdict
    from types import SimpleNamespace

    return SimpleNamespace(
        accelerator=SimpleNamespace(scaler=scaler, optimizer_step_was_skipped=skipped),
        state=SimpleNamespace(global_step=step),
        args=SimpleNamespace(output_dir=None, learning_rate=1e-4),
        _metrics={"train": defaultdict(list)},
    )


def test_scaled_fp16_steps_are_the_scalers_and_counted():
    """With fp16 loss scaling, inf gradients are how the scale calibrates: the scaler skips those steps, so the
    guard leaves them alone and counts them (``fp16/skipped_steps``, a running total per optimizer step)."""
    from slimrl.patching.every_trainer.nonfinite import NonFiniteStepError, check_finite_step, count_skipped_scaler_step

    model = torch.nn.Linear(3, 2)
    model.weight.grad = torch.full_like(model.weight, float("inf"))
    check_finite_step(_fake_trainer(scaler=_Scaler()), model, torch.tensor(1.0))  # no stop
    with pytest.raises(NonFiniteStepError, match=r"step 1: the gradient of weight has NaN/inf values"):
        check_finite_step(_fake_trainer(), model, torch.tensor(1.0))  # fp32, no scaler: TRL would apply it

    trainer = _fake_trainer(scaler=_Scaler())
    count_skipped_scaler_step(trainer)  # first step: nothing ran yet
    for step, skipped in ((1, True), (2, False), (3, True)):
        trainer.state.global_step, trainer.accelerator.optimizer_step_was_skipped = step, skipped
        count_skipped_scaler_step(trainer)
        count_skipped_scaler_step(trainer)  # a second micro-batch of the same step counts nothing
    assert trainer._metrics["train"]["fp16/skipped_steps"] == [1.0, 1.0, 2.0]


def test_finite_check_is_exact_on_every_dtype():
    from slimrl.patching.every_trainer.nonfinite import all_finite

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        big = torch.full((4,), 60000.0, dtype=dtype)  # finite, but their sum overflows fp16
        assert all_finite([big, big.clone()])
        for bad in (float("nan"), float("inf"), -float("inf")):
            t = torch.zeros(5, dtype=dtype)
            t[3] = bad
            assert not all_finite([big, t]), (dtype, bad)
    assert all_finite([])


@pytest.mark.parametrize("fused", [False, True])
def test_a_skipped_step_is_counted_with_a_fused_optimizer_too(fused):
    """An inf step under a real GradScaler: with a fused AdamW (transformers' default ``adamw_torch_fused``) the
    scaler hands the inf check to the optimizer's step, so accelerate's ``step_was_skipped`` says False; the halved
    scale says it was skipped, and slimrl counts it (seen on an H200: 0 skipped steps after an inf step)."""
    from types import SimpleNamespace

    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.state import AcceleratorState

    from slimrl.patching.every_trainer.nonfinite import count_skipped_scaler_step

    Accelerator(cpu=True)
    try:
        p = torch.nn.Parameter(torch.ones(4))
        scaler = torch.amp.GradScaler("cpu")
        optimizer = AcceleratedOptimizer(
            torch.optim.AdamW([p], lr=0.1, fused=fused), device_placement=False, scaler=scaler
        )
        trainer = _fake_trainer(scaler=scaler)

        class Acc(SimpleNamespace):  # accelerate's property: any of its optimizers flags a skipped step
            optimizer_step_was_skipped = property(lambda self: self.optimizer.step_was_skipped)

        trainer.accelerator = Acc(scaler=scaler, optimizer=optimizer)
        count_skipped_scaler_step(trainer)  # step 1 starts
        scaler.scale((p * float("inf")).sum()).backward()
        optimizer.step()  # skipped: inf gradients
        assert torch.equal(p.detach(), torch.ones(4)) and optimizer.step_was_skipped is not fused
        trainer.state.global_step = 1
        count_skipped_scaler_step(trainer)  # step 2 starts: step 1 is inspected
        optimizer.zero_grad()
        scaler.scale(p.sum()).backward()
        optimizer.step()  # taken
        trainer.state.global_step = 2
        count_skipped_scaler_step(trainer)
        assert trainer._metrics["train"]["fp16/skipped_steps"] == [1.0, 1.0]
    finally:
        AcceleratorState._reset_state(True)
