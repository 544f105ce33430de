"""Bad input to the patched GRPO trainer and config: each case stops with a message that names the argument, the
value and the fix (asserted on the text), before any compute where the input allows it."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from packaging.version import Version

from slimrl import PatchFastRL
from slimrl.patching.every_trainer.state import config_state
from tests.tiny import CPU_ARGS, tiny_llama, tiny_tokenizer

CPU = dict(**CPU_ARGS, gradient_checkpointing=False)


@pytest.fixture(autouse=True)
def _grpo(grpo_patched):
    yield


def _config(tmp_path, **kw):
    from trl import GRPOConfig

    base = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=6,
        max_steps=1,
        **CPU,
    )
    return GRPOConfig(**{**base, **kw})


def _trainer(tmp_path, reward, prompts=("1+2=", "3+4="), model=None, **cfg):
    from datasets import Dataset
    from trl import GRPOTrainer

    return GRPOTrainer(
        model=model or tiny_llama(),
        args=_config(tmp_path, **cfg),
        reward_funcs=[reward],
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=tiny_tokenizer(),
    )


def ones(completions, **kwargs):
    return [1.0] * len(completions)


@pytest.mark.parametrize("temperature", [0.0, -1.0, 10.5, 15.0])
def test_temperature_unsloth_refuses_is_a_warning(tmp_path, temperature):
    """TRL accepts the config, so slimrl does; the warning says what Unsloth would have refused."""
    with pytest.warns(
        UserWarning,
        match=rf"temperature={temperature} is invalid: it must be > 0 and <= 10.*"
        rf"Unsloth refuses this, TRL accepts it",
    ):
        assert _config(tmp_path, temperature=temperature).temperature == temperature


def test_negative_learning_rate_is_a_warning(tmp_path):
    with pytest.warns(UserWarning, match=r"learning_rate=-1e-05 is invalid: it must be >= 0.*Unsloth refuses"):
        assert _config(tmp_path, learning_rate=-1e-5).learning_rate == -1e-5


@pytest.mark.parametrize("lr", [2.0, 1e-9])
def test_learning_rate_out_of_range_warns(tmp_path, lr):
    with pytest.warns(UserWarning, match=rf"learning_rate={lr} is outside \[1e-7, 1\]: check it"):
        _config(tmp_path, learning_rate=lr)


def test_batch_not_a_multiple_of_num_generations_is_fixed(tmp_path):
    """Unsloth users write per_device_train_batch_size=1, num_generations=8: it runs, with a message."""
    with pytest.warns(
        UserWarning,
        match=r"per_device_train_batch_size=1 x gradient_accumulation_steps=1 x 1 "
        r"process\(es\) is not a multiple of num_generations=4: slimrl set "
        r"per_device_train_batch_size=4",
    ):
        cfg = _config(tmp_path, per_device_train_batch_size=1, num_generations=4)
    assert cfg.per_device_train_batch_size == 4


def test_mini_batch_larger_than_generation_batch(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"unsloth_grpo_mini_batch=9 is invalid: use an int from 1 to the "
        r"generation batch \(2 = ",
    ):
        _config(tmp_path, unsloth_grpo_mini_batch=9)
    assert _config(tmp_path, unsloth_grpo_mini_batch=1).unsloth_grpo_mini_batch == 1


def test_fp16_model_with_bf16(tmp_path):
    """Unsloth's TypeError, here a warning: TRL trains an fp16 model under bf16 autocast."""
    from slimrl.patching.every_trainer.validation import check_precision

    with pytest.warns(
        UserWarning, match="the model is float16 but the config has bf16=True: set bf16=False.*Unsloth refuses this"
    ):
        check_precision(tiny_llama().to(torch.float16), _explicit(SimpleNamespace(fp16=False, bf16=True), {"bf16"}))


def _explicit(config, names: set[str]):
    """``config`` as if the user had written ``names`` (what a patched config's __init__ records)."""
    config_state(config).explicit = frozenset(names)
    return config


def test_bf16_model_with_fp16():
    from slimrl.patching.every_trainer.validation import check_precision

    with pytest.warns(UserWarning, match="the model is bfloat16 but the config has fp16=True: set fp16=False"):
        check_precision(tiny_llama().to(torch.bfloat16), _explicit(SimpleNamespace(fp16=True, bf16=False), {"fp16"}))
    # TRL's own default (fp16 not written by the user) is never refused
    check_precision(tiny_llama().to(torch.bfloat16), _explicit(SimpleNamespace(fp16=True, bf16=False), set()))


def test_sequence_budget_over_max_seq_length():
    from slimrl.patching.every_trainer.validation import check_sequence_budget

    model = SimpleNamespace(max_seq_length=64)
    with pytest.raises(
        ValueError,
        match=r"max_completion_length=64 leaves no room for the prompt within the "
        r"model's max_seq_length=64",
    ):
        check_sequence_budget(model, SimpleNamespace(max_completion_length=64))


def test_empty_dataset(tmp_path):
    with pytest.raises(ValueError, match="train_dataset is empty: pass a dataset with at least one row"):
        _trainer(tmp_path, ones, prompts=())


def test_dataset_without_prompt_column(tmp_path):
    from datasets import Dataset
    from trl import GRPOTrainer

    with pytest.raises(ValueError, match=r"train_dataset has no 'prompt' column \(columns: question\): rename"):
        GRPOTrainer(
            model=tiny_llama(),
            args=_config(tmp_path),
            reward_funcs=[ones],
            train_dataset=Dataset.from_list([{"question": "1+2="}]),
            processing_class=tiny_tokenizer(),
        )


def test_preference_dataset_without_chosen_rejected(tmp_path):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    PatchFastRL("dpo")
    ds = Dataset.from_list([{"prompt": "1+2=", "good": "3", "bad": "4"}])
    with pytest.raises(
        ValueError,
        match=r"train_dataset has columns \(prompt, good, bad\) but DPOTrainer reads "
        r"\('chosen', 'rejected'\): rename the columns to that layout",
    ):
        DPOTrainer(
            model=tiny_llama(),
            args=DPOConfig(output_dir=str(tmp_path), **CPU),
            train_dataset=ds,
            processing_class=tiny_tokenizer(),
        )


def test_kto_dataset_without_label_and_a_subclass_reads_its_bases_layout(tmp_path):
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    PatchFastRL("kto")

    class MyKTO(KTOTrainer):
        pass

    ds = Dataset.from_list([{"prompt": "1+2=", "completion": "3"}])
    with pytest.raises(
        ValueError,
        match=r"but KTOTrainer reads \('prompt', 'completion', 'label'\) or "
        r"\('chosen', 'rejected'\)",
    ):
        MyKTO(
            model=tiny_llama(),
            args=KTOConfig(output_dir=str(tmp_path), **CPU),
            train_dataset=ds,
            processing_class=tiny_tokenizer(),
        )


def test_reward_function_that_raises_is_named(tmp_path):
    def score(completions, **kwargs):
        raise KeyError("answer")

    trainer = _trainer(tmp_path, score)
    with pytest.raises(
        RuntimeError,
        match=r"reward function 'score' raised KeyError: 'answer' \(first prompt of "
        r"the batch: '[0-9+=]+'\)",
    ):
        trainer.train()


def test_reward_function_wrong_length(tmp_path):
    def short(completions, **kwargs):
        return [1.0]

    with pytest.raises(
        ValueError,
        match=r"reward function 'short' returned 1 values for 2 completions: return a "
        r"list with one float",
    ):
        _trainer(tmp_path, short).train()


def test_reward_function_nan(tmp_path):
    def broken(completions, **kwargs):
        return [float("nan")] * len(completions)

    with pytest.raises(
        ValueError,
        match=r"reward function 'broken' returned nan for completion 0 .*: return a "
        r"finite float, or None",
    ):
        _trainer(tmp_path, broken).train()


def test_reward_none_is_allowed_as_in_trl(tmp_path):
    def partial(completions, **kwargs):
        return [None] + [1.0] * (len(completions) - 1)

    trainer = _trainer(tmp_path, partial)
    trainer.train()
    assert trainer.state.global_step == 1


def test_trl_outside_the_supported_range_is_named():
    from slimrl.compat.trl_info import SUPPORTED_TRL, check_trl_supported

    with pytest.warns(
        UserWarning,
        match=rf"slimrl supports trl {SUPPORTED_TRL}; the installed trl 1.11.0 is "
        r"outside that range.*pip install",
    ):
        assert not check_trl_supported(Version("1.11.0"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_trl_supported(Version("1.16.0"))


def test_nan_loss_stops_the_step_and_keeps_the_checkpoint(tmp_path):
    """A NaN in the forward at step 3 stops training before the update; checkpoint-2 is untouched."""
    from safetensors.torch import load_file

    from slimrl.patching.every_trainer.nonfinite import NonFiniteStepError

    model = tiny_llama()

    def poison(module, args, output):  # NaN hidden states in the gradient forwards of the third step on
        return output * float("nan") if torch.is_grad_enabled() and trainer.state.global_step >= 2 else output

    def length(completions, **kwargs):  # varies across completions, so steps 1-2 have gradients
        return [float(len(c)) for c in completions]

    trainer = _trainer(
        tmp_path,
        length,
        model=model,
        max_steps=4,
        save_strategy="steps",
        save_steps=2,
        learning_rate=0.1,
        temperature=1.5,
    )
    model.model.norm.register_forward_hook(poison)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(
        NonFiniteStepError,
        match=r"step 3: the loss is nan; the update was not applied\. Likely "
        r"causes: learning_rate=0.1 too high.*checkpoint-2\) is intact",
    ):
        trainer.train()
    saved = load_file(str(tmp_path / "out" / "checkpoint-2" / "model.safetensors"))
    now = model.state_dict()
    assert any(not torch.equal(before[k], now[k]) for k in before), "steps 1-2 must have trained"
    for key, value in saved.items():
        assert torch.equal(value, now[key]), f"{key}: the failed step changed the weights after checkpoint-2"
