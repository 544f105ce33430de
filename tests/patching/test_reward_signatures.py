"""Reward functions written without ``**kwargs`` (``def reward_fn(completions, prompts)``): TRL alone passes every
argument and stops with a TypeError; patched, each gets exactly the arguments it names, and one that requires an
argument TRL never passes is refused at trainer start, naming what TRL passes."""

from __future__ import annotations

import pytest

from slimrl import PatchFastRL, unpatch
from tests.tiny import tiny_llama, tiny_tokenizer

seen: list[dict] = []


def reward_fn(completions, prompts):
    seen.append({"completions": completions, "prompts": prompts})
    return [float(len(c)) for c in completions]


def reward_answer(completions, answer, scale=1.0):
    seen.append({"answer": answer, "scale": scale})
    return [scale * float(c.count(a)) for c, a in zip(completions, answer, strict=True)]


def needs_ground_truth(completions, ground_truth):
    return [0.0] * len(completions)


def _trainer(tmp_path, reward_funcs):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        max_steps=1,
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=False,
        use_cpu=True,
        bf16=False,
    )
    ds = Dataset.from_list([{"prompt": "1+1=", "answer": "2"}] * 4)
    return GRPOTrainer(
        model=tiny_llama(), args=config, reward_funcs=reward_funcs, train_dataset=ds, processing_class=tiny_tokenizer()
    )


def test_trl_alone_stops_on_a_reward_without_kwargs(tmp_path):
    trainer = _trainer(tmp_path, [reward_fn])
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        trainer.train()


def test_patched_gives_each_function_the_arguments_it_names(tmp_path, capfd):
    seen.clear()
    PatchFastRL("grpo")
    try:
        trainer = _trainer(tmp_path, [reward_fn, reward_answer])
        trainer.train()
    finally:
        unpatch()
    assert trainer.state.global_step == 1
    assert {"completions", "prompts"} == set(seen[0]) and seen[0]["prompts"][0] == "1+1="
    assert seen[1] == {"answer": ["2", "2"], "scale": 1.0}
    names = [k for k in trainer.state.log_history[0] if k.startswith("rewards/") and k.endswith("/mean")]
    assert names == ["rewards/reward_fn/mean", "rewards/reward_answer/mean"]  # TRL's metric names kept
    err = capfd.readouterr().err
    assert (
        "reward function 'reward_fn' has no **kwargs: it is given only the arguments it names "
        "(completions, prompts)" in err
    )


def test_an_argument_trl_never_passes_is_refused_at_start(tmp_path):
    PatchFastRL("grpo")
    try:
        with pytest.raises(
            TypeError,
            match=r"'needs_ground_truth' requires 'ground_truth', which TRL does not "
            r"pass: it passes prompts, completions.*dataset's columns \(answer\)",
        ):
            _trainer(tmp_path, [needs_ground_truth])
    finally:
        unpatch()
