"""Agentic GRPO (TRL's ``tools=``, ``environment_factory=``, ``rollout_func=``) through slimrl's paths: TRL alone vs
patched on the same scripted rollouts — the same completions and tool results reach the rewards, the same logged
losses and tool metrics, the same parameter updates after two steps.

Generations are scripted as TRL's own tests script them (:class:`slimrl.verify.agentic.Scripted`, shared with
``slimrl verify``'s agentic rows), so the tool loop meets what a trained model would write: a valid call, a call
with a wrong argument name, a call whose tool raises, malformed JSON, plain text, and a second turn after each tool
result. The tokenizer is
:func:`slimrl.verify.tiny.chat_tokenizer` (character level, Qwen3's chat template and response parser); the model a
2-layer Qwen2-style LoRA policy, fp32. The multi-turn rows (tool-result tokens inside the completion, masked from the
loss by TRL's ``tool_mask`` / ``env_mask``) go through the shared-prefix layout: the prompt, with its tool
descriptions, is the prefix.

Tolerance: relative error <= 1e-4 on updates and losses (fp32; the packed forward sums attention over the same keys
in a different grouping and the head's vocabulary chunks in another order, ~1e-7 relative per op, accumulated over 2
layers, the backward and 2 steps). Tool metrics equal exactly (they count calls)."""

from __future__ import annotations

import inspect

import pytest
import torch

from slimrl.patching.every_trainer.state import trainer_state
from slimrl.verify.agentic import (
    ENV_TURNS,
    QUESTIONS,
    Counter,
    Echo,
    Scripted,
    divide,
    first_turns,
    multiply,
    multiply_async,
    rollout_func,
)
from slimrl.verify.agentic import completion_text as _text
from tests.patching.parity import assert_patched_equals_unpatched


def _trl_has(keyword: str) -> bool:
    from trl import GRPOTrainer

    return keyword in inspect.signature(GRPOTrainer.__init__).parameters


pytestmark = pytest.mark.skipif(not _trl_has("environment_factory"), reason="this TRL's GRPO has no agentic paths")


def _policy(tokenizer):
    from peft import LoraConfig, get_peft_model

    from tests.patching.routes.test_shared_prefix import _model

    model = _model("qwen2", vocab_size=len(tokenizer), max_position_embeddings=4096)
    torch.manual_seed(1)
    return get_peft_model(
        model,
        LoraConfig(
            r=4,
            lora_alpha=8,
            target_modules=["q_proj", "v_proj", "up_proj"],
            init_lora_weights=False,
            task_type="CAUSAL_LM",
        ),
    )


def run_agentic(out, trainer_kwargs: dict, first: list[str] | None = None, dataset="questions", **cfg):
    """Two steps of GRPO (SGD) with ``trainer_kwargs`` (tools / environment_factory / rollout_func) on scripted
    generations; (completions the rewards saw, updates, losses, trainer) as the parity helper takes them, the
    trainer's log history on ``trainer.logged``."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from slimrl.verify.tiny import chat_tokenizer

    tok = chat_tokenizer()
    model = _policy(tok)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    seen: list[list[str]] = []

    def reward_length(completions, **kwargs):
        seen.append([_text(c) for c in completions])
        return [float(len(_text(c)) % 7) for c in completions]

    if dataset == "questions":
        dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in QUESTIONS])
    args = dict(
        output_dir=str(out),
        per_device_train_batch_size=6,
        num_generations=6,
        max_completion_length=160,
        gradient_accumulation_steps=2,
        max_steps=2,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        beta=0.04,
        loss_type="dapo",
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        logging_steps=1,
        seed=7,
        gradient_checkpointing=False,
        disable_dropout=True,
        shuffle_dataset=False,
    )
    args.update(cfg)
    kwargs = dict(trainer_kwargs)
    reward_funcs = kwargs.pop("reward_funcs", [reward_length])
    trainer = GRPOTrainer(
        model=model,
        args=GRPOConfig(**args),
        reward_funcs=reward_funcs,
        processing_class=tok,
        train_dataset=dataset,
        **kwargs,
    )
    if first is not None:
        model.generate = Scripted(tok, first)
    trainer.train()
    deltas = {n: p.detach() - before[n] for n, p in model.named_parameters() if p.requires_grad}
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    trainer.logged = [h for h in trainer.state.log_history if "loss" in h]
    if not seen:  # rewards the environment owns only: the trainer's own record of the completions
        seen = [[str(h.get("reward"))] for h in trainer.logged]
    return seen, deltas, losses, trainer


def _parity(tmp_path, trainer_kwargs, **kwargs):
    """TRL alone vs patched (:func:`assert_patched_equals_unpatched`); also the tool metrics TRL logs."""
    runs = {}

    def run(out):
        result = run_agentic(out, trainer_kwargs, **kwargs)
        runs[out.name] = result[3].logged
        return result

    trainer = assert_patched_equals_unpatched(run, "grpo", tmp_path)
    assert trainer_state(trainer).shared_prefix_forwards > 0, "the multi-turn rows did not take the shared prefix"
    for key in {k for h in runs["trl"] for k in h if k.startswith(("tools/", "rewards/"))}:
        got, ref = [h.get(key) for h in runs["slim"]], [h.get(key) for h in runs["trl"]]
        assert got == pytest.approx(ref, rel=1e-6), f"{key}: {got} vs TRL alone {ref}"
    return trainer, runs["trl"]


@pytest.mark.parametrize("tool", [multiply, multiply_async], ids=["sync", "async"])
def test_tools_train_as_trl_alone(tmp_path, tool):
    """Valid, wrong-argument, failing-tool, malformed, plain and second valid call in each group; the tool-result
    tokens are part of the completion (masked from the loss) and the rows still take the shared-prefix layout."""
    trainer, logged = _parity(tmp_path, {"tools": [tool, divide]}, first=first_turns(tool.__name__))
    assert [h["tools/call_frequency"] for h in logged] == pytest.approx([4 / 6] * 2)  # 4 parsed calls of 6
    assert [h["tools/failure_frequency"] for h in logged] == pytest.approx([2 / 4] * 2)  # wrong argument, b = 0


def test_environment_with_its_own_reward_mixed_with_reward_funcs(tmp_path):
    """One environment class: its tool in the loop, its ``get_reward`` a second reward source beside
    ``reward_funcs`` (TRL logs it under the class name)."""
    _, logged = _parity(tmp_path, {"environment_factory": Counter}, first=ENV_TURNS)
    assert logged[0]["rewards/Counter/mean"] > 0 and logged[0]["tools/call_frequency"] == pytest.approx(5 / 6)


def test_several_environments_chosen_per_row(tmp_path):
    """A dict of environments, each row's from its ``environment`` column; a call to the other environment's tool
    fails as it fails in TRL alone."""
    from datasets import Dataset

    rows = [
        {"prompt": [{"role": "user", "content": q}], "environment": env}
        for q, env in zip(QUESTIONS, ["counter", "echo"], strict=True)
    ]
    _, logged = _parity(
        tmp_path,
        {"environment_factory": {"counter": Counter, "echo": Echo}},
        first=ENV_TURNS,
        dataset=Dataset.from_list(rows),
    )
    assert logged[0]["tools/failure_frequency"] == pytest.approx(3 / 5)  # wrong argument, each other's tool


def test_environment_owned_data_with_max_steps(tmp_path):
    """No dataset: the environment's ``reset`` gives every prompt; ``max_steps`` bounds the run."""
    _, logged = _parity(tmp_path, {"environment_factory": Counter}, first=ENV_TURNS, dataset=None)
    assert len(logged) == 2 and logged[0]["tools/call_frequency"] == pytest.approx(5 / 6)


@pytest.mark.skipif(not _trl_has("rollout_func"), reason="this TRL's GRPO has no rollout_func")
def test_rollout_func_extra_fields_and_env_mask(tmp_path):
    """A custom rollout: its completions hold environment feedback masked by ``env_mask`` (0 = not the model's
    tokens), and its extra field reaches the reward functions."""
    from slimrl.verify.tiny import chat_tokenizer

    received = []

    def reward_level(completions, level, **kwargs):
        received.append(list(level))
        return [float(lv) + len(_text(c)) % 3 for lv, c in zip(level, completions, strict=True)]

    trainer, _ = _parity(tmp_path, {"rollout_func": rollout_func(chat_tokenizer()), "reward_funcs": [reward_level]})
    assert received and all(sorted(set(r)) == [0, 1, 2] for r in received), "the extra field did not reach the reward"
