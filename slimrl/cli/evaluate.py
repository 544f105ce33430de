"""Held-out evaluation of ``slimrl train`` (before and after training; greedy, or sampled for a task whose training
behaviour greedy decoding does not show), scored by the reward functions; with
tools, each completion is a tool loop as TRL's GRPO runs it (the call parsed by TRL's response parser, the tool run,
its result appended, the next turn generated)."""

from __future__ import annotations

import math
from collections.abc import Callable


def held_out_eval(
    model,
    tokenizer,
    dataset,
    reward_funcs: list[Callable],
    max_new_tokens: int,
    batch_size: int = 16,
    tools: list[Callable] | None = None,
    max_tool_rounds: int = 1,
    temperature: float | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Greedy completions for ``dataset`` (or sampled at ``temperature``, from ``seed``, the caller's random state
    left as it was); mean of each reward function (``<name>``) and of their sum. With ``tools`` (conversational
    prompts): up to ``max_tool_rounds`` tool rounds per completion, ``max_new_tokens`` per turn; the completion is
    the message list the rewards get from TRL's tool loop."""
    import torch

    from slimrl.models.modes import for_inference, for_training

    sample = {"do_sample": True, "temperature": temperature} if temperature else {"do_sample": False}
    for_inference(model)  # also left-pads the tokenizer FastLanguageModel returned, until for_training
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            completions, rows = _complete(
                model, tokenizer, dataset, batch_size, tools, max_new_tokens, max_tool_rounds, sample
            )
        finally:
            for_training(model)
    return _scores(reward_funcs, rows, completions)


def _complete(model, tokenizer, dataset, batch_size, tools, max_new_tokens, rounds, sample) -> tuple[list, list]:
    """(completions, dataset rows) of the whole dataset, ``batch_size`` prompts at a time."""
    completions, rows = [], []
    for start in range(0, len(dataset), batch_size):
        batch = dataset.select(range(start, min(start + batch_size, len(dataset))))
        if tools:
            completions += _tool_loop(model, tokenizer, batch["prompt"], tools, max_new_tokens, rounds, sample)
        else:
            prompts = [
                p
                if isinstance(p, str)
                else tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                for p in batch["prompt"]
            ]
            texts = [
                tokenizer.decode(ids, skip_special_tokens=True)
                for ids in _generate(model, tokenizer, prompts, max_new_tokens, sample)
            ]
            conversational = not isinstance(batch["prompt"][0], str)
            completions += [[{"role": "assistant", "content": t}] if conversational else t for t in texts]
        rows += list(batch)
    return completions, rows


def _scores(reward_funcs, rows, completions) -> dict[str, float]:
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


def _generate(model, tokenizer, texts: list[str], max_new_tokens: int, sample: dict) -> list[list[int]]:
    """New token ids for each text (a batch, left-padded; ``sample``: generate's sampling settings), cut after the
    first end-of-sequence token."""
    import torch

    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, **sample)
    eos = model.generation_config.eos_token_id
    stops = {*(eos if isinstance(eos, list) else [eos]), tokenizer.eos_token_id}
    result = []
    for ids in out[:, enc["input_ids"].shape[1] :].tolist():
        end = next((i + 1 for i, t in enumerate(ids) if t in stops), len(ids))
        result.append(ids[:end])
    return result


def _tool_loop(
    model, tokenizer, prompts: list, tools: list[Callable], max_new_tokens: int, rounds: int, sample: dict
) -> list[list[dict]]:
    """Each prompt's completion as TRL's GRPO builds it: assistant turn (tool calls parsed by TRL's
    ``parse_response``), each call's result as a tool message (``{'error': ...}`` when it fails), the next turn."""
    from trl.chat_template_utils import parse_response

    by_name = {t.__name__: t for t in tools}
    completions: list[list[dict]] = [[] for _ in prompts]
    active = list(range(len(prompts)))
    for turn in range(rounds + 1):
        if not active:
            break
        texts = [
            tokenizer.apply_chat_template(
                [*prompts[i], *completions[i]], tools=tools, tokenize=False, add_generation_prompt=True
            )
            for i in active
        ]
        new_ids = _generate(model, tokenizer, texts, max_new_tokens, sample)
        still = []
        for i, text, ids in zip(active, texts, new_ids):
            prefix = tokenizer(text, add_special_tokens=False)["input_ids"]
            try:
                message = parse_response(tokenizer, ids, prefix=prefix, tools=tools)
            except Exception:  # noqa: BLE001  (an unparsable turn is plain text, as a malformed call is in TRL)
                message = {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}
            completions[i].append(message)
            if not message.get("tool_calls") or turn == rounds:
                continue
            for call in message["tool_calls"]:
                function = call.get("function", call)
                try:
                    result = str(by_name[function["name"]](**(function.get("arguments") or {})))
                except Exception as err:  # noqa: BLE001  (TRL's loop turns any tool failure into an error result)
                    result = str({"error": str(err)})
                tool_message = {"role": "tool", "name": function.get("name", "unknown"), "content": result}
                completions[i].append(tool_message)
            still.append(i)
        active = still
    return completions
