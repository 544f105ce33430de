"""``slimrl verify``'s agentic rows (GRPO ``tools``, ``environment``, ``rollout_func``) and the parts the agentic
parity tests share with them: tools, environments, a custom rollout and the scripted generation.

Generations are scripted, as TRL's own agentic tests script them: the model's ``generate`` is replaced by
:class:`Scripted`, a function of the prompt (a row whose prompt holds a tool result says it is done; any other row
writes its group position's entry of the first turns: a valid call, a call with a wrong argument, a call whose tool
raises, malformed JSON, plain text, another valid call). So TRL alone and TRL + slimrl see the same rollouts, tool
results and rewards, and the rows compare what slimrl changes: the log-prob passes over multi-turn completions
(tool results inside, masked from the loss by TRL). The tokenizer is :func:`slimrl.verify.tiny.chat_tokenizer`; the
model the setup's architecture with that tokenizer's vocabulary.
"""

from __future__ import annotations

import copy
import inspect
import json
import warnings
from typing import Any

import torch

KINDS = ("tools", "environment", "rollout_func")
QUESTIONS = ["What is 3 times 4?", "Multiply 12 by 7, then say done."]


def available() -> list[str]:
    """The agentic rows the installed TRL's GRPO can run (TRL with ``environment_factory`` and ``rollout_func``,
    transformers >= 5.2)."""
    from trl import GRPOTrainer

    params = inspect.signature(GRPOTrainer.__init__).parameters
    if "environment_factory" not in params:
        return []
    return [k for k in KINDS if k != "rollout_func" or "rollout_func" in params]


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


async def multiply_async(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def divide(a: int, b: int) -> float:
    """Divide a by b.

    Args:
        a: the dividend
        b: the divisor
    """
    return a / b  # b = 0 raises: a failing tool


def call_text(name: str, **arguments: Any) -> str:
    """A tool call as the Qwen3 template writes one, ending the turn."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call><|im_end|>"


def first_turns(multiply_name: str = "multiply") -> list[str]:
    """What the model writes first, one per completion of a group (row i of a group gets entry i)."""
    return [
        call_text(multiply_name, a=3, b=4),
        call_text(multiply_name, a=3, c=4),
        call_text("divide", a=1, b=0),
        '<tool_call>\n{"name": "multiply", "arguments": {"a": 3,,}\n</tool_call><|im_end|>',
        "I know this one: 12<|im_end|>",
        call_text(multiply_name, a=12, b=7),
    ]


class Counter:
    """An environment with a tool method and its own reward (the running total)."""

    def reset(self, **kwargs):
        self.total = 0
        return "Start at zero."

    def add(self, n: int) -> str:
        """Add n to the running total.

        Args:
            n: how much to add
        """
        self.total += n
        return str(self.total)

    def get_reward(self) -> float:
        return float(self.total)


class Echo:
    """A second environment: its tool shouts back."""

    def reset(self, **kwargs):
        return None

    def shout(self, word: str) -> str:
        """Repeat a word loudly.

        Args:
            word: the word
        """
        return word.upper()


ENV_TURNS = [
    call_text("add", n=2),
    call_text("add", m=2),
    call_text("shout", word="hey"),
    "nothing to do<|im_end|>",
    call_text("add", n=5),
    call_text("add", n=1),
]


class Scripted:
    """A model's ``generate`` replaced by a script (module docstring); returns ``[prompt, completion]``
    right-padded with the pad token. Takes and ignores every other keyword (a KV cache handed in included)."""

    def __init__(self, tokenizer: Any, first: list[str]):
        self.tok, self.first = tokenizer, first
        self.response = tokenizer.convert_tokens_to_ids("<tool_response>")

    def __call__(self, input_ids: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        texts = []
        for row, ids in enumerate(input_ids.tolist()):
            if self.response in ids:
                texts.append(f"Done {sum(ids) % 97}<|im_end|>")
            else:
                texts.append(self.first[row % len(self.first)])
        rows = [self.tok(t, add_special_tokens=False).input_ids for t in texts]
        width = max(map(len, rows))
        pad = self.tok.pad_token_id
        completion = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=input_ids.device)
        return torch.cat([input_ids, completion], dim=-1)


def rollout_func(tokenizer: Any):
    """A custom rollout (TRL's ``rollout_func``): each completion says something, gets environment feedback (masked
    by ``env_mask`` = 0) and answers; its extra field ``level`` reaches the reward functions."""

    def rollout(prompts: list, trainer: Any) -> dict:
        prompt_ids, completion_ids, env_mask, level = [], [], [], []
        for i, p in enumerate(prompts):  # each prompt once per completion, as TRL passes them
            ids = tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True)[
                "input_ids"
            ]
            g = i % trainer.num_generations
            said = tokenizer(f"try {g}", add_special_tokens=False).input_ids
            feedback = tokenizer(f" [env: {'hot' if g % 2 else 'cold'}] ", add_special_tokens=False).input_ids
            final = tokenizer(f"answer {g * 3}<|im_end|>", add_special_tokens=False).input_ids
            prompt_ids.append(ids)
            completion_ids.append(said + feedback + final)
            env_mask.append([1] * len(said) + [0] * len(feedback) + [1] * len(final))
            level.append(g % 3)
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": None,
            "env_mask": env_mask,
            "level": level,
        }

    return rollout


def completion_text(completion: Any) -> str:
    """A conversational completion's messages as one string (tool calls and tool results included)."""
    return json.dumps(completion, sort_keys=True, default=str)


def length_reward(completions, **kwargs) -> list[float]:
    """A reward that varies within a group: the completion's length (tool results included) modulo 7."""
    return [float(len(completion_text(c)) % 7) for c in completions]


def level_reward(completions, level, **kwargs) -> list[float]:
    """The rollout's extra field plus a length term."""
    return [float(lv) + len(completion_text(c)) % 3 for lv, c in zip(level, completions, strict=True)]


def trainer_kwargs(kind: str, tokenizer: Any) -> tuple[dict, list[str] | None]:
    """(GRPOTrainer keywords, scripted first turns or None) of an agentic row."""
    if kind == "tools":
        return {"tools": [multiply, divide], "reward_funcs": [length_reward]}, first_turns()
    if kind == "environment":
        return {"environment_factory": Counter, "reward_funcs": [length_reward]}, ENV_TURNS
    if kind == "rollout_func":
        return {"rollout_func": rollout_func(tokenizer), "reward_funcs": [level_reward]}, None
    raise ValueError(f"agentic row {kind!r}: one of {', '.join(KINDS)}")


def chat_model(config: Any, tokenizer: Any, seed: int, dtype: torch.dtype, quantized: str | None, device: str):
    """The setup's architecture with the chat tokenizer's vocabulary (pad 0, eos 1) and room for the tool prompt,
    a LoRA adapter whose A and B are both random."""
    from peft import LoraConfig, get_peft_model

    from slimrl.models.fast_language_model import default_target_modules
    from slimrl.verify.tiny import build

    config = copy.deepcopy(config)
    text = getattr(config, "text_config", None) or config
    text.vocab_size = len(tokenizer)
    text.pad_token_id, text.eos_token_id, text.bos_token_id = 0, 1, None
    text.max_position_embeddings = max(getattr(text, "max_position_embeddings", 0) or 0, 4096)
    if getattr(text, "sliding_window", None):
        text.sliding_window = max(text.sliding_window, 4096)
    model = build(config, seed, dtype=dtype, quantized=quantized, device=device)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 1
    torch.manual_seed(1)
    return get_peft_model(
        model,
        LoraConfig(
            r=4,
            lora_alpha=8,
            target_modules=default_target_modules(model),
            init_lora_weights=False,
            task_type="CAUSAL_LM",
        ),
    )


def scenario(kit: Any, kind: str):
    """``slimrl verify``'s agentic row ``kind`` (:class:`slimrl.verify.scenarios.Kit`): two questions, 6 scripted
    completions each, two accumulated micro-batches of one group, KL to the adapter-free reference."""
    from datasets import Dataset

    from slimrl.verify.tiny import chat_tokenizer

    tok = chat_tokenizer()
    setup = kit.setup
    model = chat_model(setup.config, tok, 0, setup.dtype, setup.quantized, setup.device)
    extra, first = trainer_kwargs(kind, tok)
    args = kit.config(
        per_device_train_batch_size=6,
        num_generations=6,
        max_completion_length=160,
        gradient_accumulation_steps=2,
        beta=0.04,
        loss_type="dapo",
        disable_dropout=True,
        shuffle_dataset=False,
    )
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in QUESTIONS])
    with warnings.catch_warnings():  # TRL's "experimental feature" warning: the row is the output
        warnings.simplefilter("ignore", UserWarning)
        trainer = kit.trainer_cls(model=model, args=args, processing_class=tok, train_dataset=dataset, **extra)
    if first is not None:
        model.generate = Scripted(tok, first)
    return trainer
