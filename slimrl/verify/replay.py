"""TRL alone's sampled completions, replayed in the patched run of a 16-bit verify row.

In bf16 or fp16 the two sides' generation rounds differently (slimrl prefills each prompt once and decodes from its
cache; TRL prefills the padded batch), which can flip a sampled token: from there the two runs train on different
completions and the row would fail with no bug in slimrl. On those setups (every CUDA row) the patched run trains on
the completions TRL alone sampled, in the same order, so the comparison stays about the loss, the gradients and the
update. The generator check (:mod:`slimrl.verify.generation`) still scores what the patched run's own generator
sampled. fp32 rows do not replay: both sides sample the same tokens, and the parity of generation is checked too.
"""

from __future__ import annotations

from typing import Any

import torch


def replays(dtype: torch.dtype, device: str) -> bool:
    """Whether a row on ``device`` training in ``dtype`` replays TRL's completions (the module docstring)."""
    return device == "cuda" or dtype in (torch.bfloat16, torch.float16)


def record_or_replay(trainer: Any, recorded: list, replay: bool) -> None:
    """Wrap ``trainer._generate_single_turn`` (GRPO, RLOO; instance only): append each call's completion ids to
    ``recorded`` (TRL alone's run), or (``replay``) hand back the recorded ones of the same call in their place when
    they cover the same rows."""
    generate = getattr(trainer, "_generate_single_turn", None)
    if generate is None:
        return
    calls = [0]

    def single_turn(*args: Any, **kwargs: Any) -> Any:
        out = generate(*args, **kwargs)
        ids = out[0] if isinstance(out, tuple) else out  # GRPO: (completion ids, logprobs); RLOO: the ids
        if not replay:
            recorded.append([list(row) for row in ids])
            return out
        index, calls[0] = calls[0], calls[0] + 1
        if index >= len(recorded) or len(recorded[index]) != len(ids):
            return out
        return (recorded[index], *out[1:]) if isinstance(out, tuple) else recorded[index]

    trainer._generate_single_turn = single_turn
