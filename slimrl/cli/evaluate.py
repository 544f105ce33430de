"""Greedy held-out evaluation of ``slimrl train`` (before and after training), scored by the reward functions."""

from __future__ import annotations

import math
from collections.abc import Callable


def greedy_eval(model, tokenizer, dataset, reward_funcs: list[Callable], max_new_tokens: int,
                batch_size: int = 16) -> dict[str, float]:
    """Greedy completions for ``dataset``; mean of each reward function (``<name>``) and of their sum."""
    import torch

    from slimrl.models.modes import for_inference, for_training

    for_inference(model)  # also left-pads the tokenizer FastLanguageModel returned, until for_training
    completions, rows = [], []
    try:
        for start in range(0, len(dataset), batch_size):
            batch = dataset.select(range(start, min(start + batch_size, len(dataset))))
            prompts = [p if isinstance(p, str) else tokenizer.apply_chat_template(p, tokenize=False,
                                                                                   add_generation_prompt=True)
                       for p in batch["prompt"]]
            enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            conversational = not isinstance(batch["prompt"][0], str)
            completions += [[{"role": "assistant", "content": t}] if conversational else t for t in texts]
            rows += list(batch)
    finally:
        for_training(model)
    extra = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"} if rows else {}
    scores = {}
    total = [0.0] * len(completions)
    for fn in reward_funcs:
        vals = fn(prompts=[r["prompt"] for r in rows], completions=completions, **extra)
        vals = [0.0 if v is None or not math.isfinite(v) else float(v) for v in vals]
        scores[fn.__name__] = sum(vals) / len(vals)
        total = [t + v for t, v in zip(total, vals)]
    scores["reward"] = sum(total) / len(total) if total else float("nan")
    return scores
