"""The patched GRPOTrainer refuses sequences longer than the model's max_seq_length, with a clear message."""

from __future__ import annotations

import pytest

from slimrl import FastLanguageModel, PatchFastRL, unpatch
from tests.tiny import tiny_llama, tiny_tokenizer


def _trainer(tmp_path, max_seq_length, prompt, completion_len):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    path = tmp_path / "m"
    tiny_llama().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    model, tok = FastLanguageModel.from_pretrained(str(path), max_seq_length=max_seq_length)
    model = FastLanguageModel.get_peft_model(model, r=2)
    cfg = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=completion_len,
        max_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
    )
    return GRPOTrainer(
        model=model,
        args=cfg,
        reward_funcs=[lambda completions, **k: [1.0] * len(completions)],
        train_dataset=Dataset.from_list([{"prompt": prompt}] * 2),
        processing_class=tok,
    )


def test_completion_budget_over_max_seq_length(tmp_path, grpo_patched):
    with pytest.raises(ValueError, match=r"max_completion_length=32 leaves no room .* max_seq_length=32"):
        _trainer(tmp_path, 32, "1+1=", 32)


def test_long_prompt_fails_before_the_forward(tmp_path, grpo_patched):
    trainer = _trainer(tmp_path, 20, "1+1=" * 6, 8)  # 24 prompt tokens + 8 > 20
    with pytest.raises(ValueError, match=r"prompt \+ completion of \d+ tokens exceeds the model's max_seq_length=20"):
        trainer.train()


def test_layouts_accept_every_form_trl_accepts():
    """Never stricter than TRL: raw text, conversational (same columns) and the pre-tokenized forms the installed
    TRL passes through (Reward's chosen_ids/rejected_ids and their legacy names, SFT's and PRM's input_ids)."""
    from types import SimpleNamespace

    from datasets import Dataset

    from slimrl.patching import TRAINERS, trainer_and_config, trainer_available
    from slimrl.patching.every_trainer.validation import check_layout
    from slimrl.patching.table import trainer_layouts

    for name in TRAINERS:
        if not trainer_available(name) or name == "ppo":
            continue
        trainer_cls, _ = trainer_and_config(name)
        trainer, layouts = trainer_layouts(trainer_cls, SimpleNamespace(dataset_text_field="text"))
        assert layouts, name
        for layout in layouts:
            check_layout(Dataset.from_list([{c: "x" for c in layout}]), trainer, layouts)
        with pytest.raises(ValueError, match=r"train_dataset has (no|columns)"):
            check_layout(Dataset.from_list([{"unrelated": "x"}]), trainer, layouts)


def test_sft_layout_follows_its_config():
    from types import SimpleNamespace

    from datasets import Dataset
    from trl import SFTTrainer

    from slimrl.patching.every_trainer.validation import check_layout
    from slimrl.patching.table import trainer_layouts

    def check(dataset, args, **kwargs):
        check_layout(dataset, *trainer_layouts(SFTTrainer, args), args, **kwargs)

    body = Dataset.from_list([{"body": "1+1=2"}])
    with pytest.raises(ValueError, match=r"SFTTrainer reads \('other'\) or \('messages'\)"):
        check(body, SimpleNamespace(dataset_text_field="other", dataset_kwargs=None))
    check(body, SimpleNamespace(dataset_text_field="body", dataset_kwargs=None))
    check(
        body, SimpleNamespace(dataset_text_field="text", dataset_kwargs=None), formatting_func=lambda row: row["body"]
    )
    check(body, SimpleNamespace(dataset_text_field="text", dataset_kwargs={"skip_prepare_dataset": True}))


@pytest.mark.parametrize("columns", [("chosen_ids", "rejected_ids"), ("chosen_input_ids", "rejected_input_ids")])
def test_reward_trainer_with_pretokenized_pairs_trains(tmp_path, columns):
    """TRL 1.16's own pre-tokenized Reward test, through the patched trainer: the layout is accepted."""
    import warnings

    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    from tests.tiny import tiny_llama_scorer

    tok = tiny_tokenizer()
    rows = [
        {columns[0]: tok(f"{a}+1={a + 1}").input_ids, columns[1]: tok(f"{a}+1={a + 2}").input_ids} for a in range(4)
    ]
    PatchFastRL("reward")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # TRL's own deprecation of the legacy column names
            trainer = RewardTrainer(
                model=tiny_llama_scorer(),
                train_dataset=Dataset.from_list(rows),
                processing_class=tok,
                args=RewardConfig(
                    output_dir=str(tmp_path),
                    use_cpu=True,
                    bf16=False,
                    max_steps=1,
                    per_device_train_batch_size=2,
                    report_to="none",
                    save_strategy="no",
                ),
            )
        trainer.train()
        assert trainer.state.log_history[-1]["train_loss"] is not None
    finally:
        unpatch()
