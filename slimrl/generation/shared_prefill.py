"""Generation's prefill once per distinct prompt (HF ``generate``; GRPO, ``slimrl_shared_prefix``).

TRL's HF-generate path hands ``generate`` every prompt ``num_generations`` times, and the prefill — the forward over
all prompt tokens that fills the KV cache — runs over each copy: ``G x P`` tokens per group where ``P`` would do.
Here, for one ``generate`` call, the distinct rows (prompt ids and mask) are prefilled once over their first ``P - 1``
tokens, the cache is expanded to every row (``Cache.batch_select_indices`` with each row's distinct index) and TRL's
own ``generate`` call runs from it: transformers sees a cache of ``P - 1`` tokens and starts with the last prompt
token, so the first sampled token comes from that token's logits exactly as in a full prefill, and decoding is
TRL's (same sampling, same random draws: the prefill draws none, the model is in inference mode).

Position ids of the prefill are generation's own (``cumsum(attention_mask) - 1``); padded positions are masked keys,
so their values never reach a real token. A row's K/V then equal what TRL's prefill writes for it, up to the
summation order of a matmul over fewer rows (fp32: ~1e-6).

TRL's ``generate`` call is left alone (one log line, once per reason) when: the call carries other inputs (images,
token types), beam search or an assistant model, a cache implementation or chunked prefill is asked for, generation
runs without a KV cache (``use_cache`` False in the call's or the model's generation config), a module in training
mode would draw random numbers (dropout or router jitter above 0: the prefill would draw other ones than TRL's) or
checkpoint its layer (no KV cache then), the model is an encoder-decoder, or its cache has layers whose state cannot
be expanded row by row (linear attention and convolutions: LFM2, Qwen3.5; read from the cache transformers builds).
A model in training mode with nothing that draws (TRL's RLOO generates so; ``disable_dropout``, LoRA without
dropout) computes what it computes in eval mode, so its prefill is shared. A call where no prompt repeats runs
unchanged without a line.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from slimrl.compat.host_transfer import read_together, to_device

logger = logging.getLogger("slimrl")
_SAID: set[str] = set()
_INPUTS = {"input_ids", "attention_mask", "generation_config"}


def distinct_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``([U], [B])``: the first row of each distinct (ids, mask) pair, and each row's index into them."""
    first: dict[tuple, int] = {}
    rows, inverse = [], []
    ids, mask = read_together([input_ids, attention_mask])  # one host sync
    for row, key in enumerate(zip(map(tuple, ids), map(tuple, mask), strict=True)):
        if key not in first:
            first[key] = len(rows)
            rows.append(row)
        inverse.append(first[key])
    device = input_ids.device
    return to_device(rows, device), to_device(inverse, device)


def why_not(model: Any, args: tuple, kwargs: dict) -> str | None:
    """Why this ``generate`` call keeps TRL's prefill ("" for no line; None: it can share)."""
    if args or not _INPUTS >= set(kwargs) or "input_ids" not in kwargs:
        return "the call carries other inputs than prompt ids and mask"
    config = kwargs.get("generation_config")
    if config is not None:
        if (getattr(config, "num_beams", 1) or 1) > 1:
            return "beam search"
        if getattr(config, "cache_implementation", None) or getattr(config, "prefill_chunk_size", None):
            return "a cache implementation or chunked prefill is set"
        if getattr(config, "assistant_model", None) or getattr(config, "prompt_lookup_num_tokens", None):
            return "assisted decoding"
    if not _uses_cache(model, config):
        return "generation without a KV cache (use_cache=False)"
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "is_encoder_decoder", False):
        return "an encoder-decoder model"
    unselectable = _layers_without_row_selection(base.config)
    if unselectable:
        return f"a cache whose {unselectable} layers keep states the prefill cannot expand row by row"
    drawing = _draws_in_training(model)
    if drawing:
        return f"a module in training mode with {drawing}"
    if kwargs["input_ids"].size(1) < 2:
        return ""
    return None


def _layers_without_row_selection(config: Any) -> str:
    """The kinds of the model's cache layers that cannot be expanded to every row (LFM2's convolutions, Qwen3.5's
    Gated-DeltaNet: transformers' linear-attention layers keep conv/recurrent states besides any keys and values),
    read from the cache transformers builds for the config; "" when every layer can."""
    try:
        from transformers.cache_utils import DynamicCache, LinearAttentionCacheLayerMixin
    except ImportError:  # a transformers without linear-attention caches
        from transformers.cache_utils import DynamicCache

        LinearAttentionCacheLayerMixin = ()  # noqa: N806
    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # noqa: BLE001 - a config transformers builds no cache from: the prefill finds out itself
        return ""
    kinds = {
        type(layer).__name__
        for layer in layers
        if isinstance(layer, LinearAttentionCacheLayerMixin)
        or not callable(getattr(layer, "batch_select_indices", None))
    }
    return ", ".join(sorted(kinds))


_RANDOM_RATES = ("attention_dropout", "dropout", "hidden_dropout", "router_jitter_noise", "jitter_noise")


def _draws_in_training(model: Any) -> str:
    """What makes ``model``'s forward differ from its eval-mode forward ("" for nothing): a module in training mode
    that draws random numbers (a dropout module with ``p > 0``, a dropout or jitter rate above 0 read at call time)
    or checkpoints its layer."""
    for name, m in model.named_modules():
        if not m.training:
            continue
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            return f"dropout p={m.p} ({name})"
        for attr in _RANDOM_RATES:
            rate = getattr(m, attr, None)
            if isinstance(rate, float) and rate > 0:
                return f"{attr}={rate} ({name})"
        if getattr(m, "gradient_checkpointing", False) is True:
            return f"gradient checkpointing ({name or 'the model'})"
    return ""


def _uses_cache(model: Any, config: Any) -> bool:
    """``use_cache`` as ``generate`` resolves it: the call's generation config, else the model's, else True."""
    for source in (config, getattr(model, "generation_config", None)):
        value = getattr(source, "use_cache", None)
        if value is not None:
            return bool(value)
    return True


def _say_once(reason: str) -> None:
    if reason and reason not in _SAID:
        _SAID.add(reason)
        logger.info("slimrl: shared prefill off (%s): TRL's generate, each prompt prefilled per completion", reason)


def _cache_keyword(model: Any) -> str:
    """The model's (and so ``generate``'s) name for the KV cache: ``cache`` from transformers 5.24, before it
    ``past_key_values``."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def prefill_once(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any | None:
    """The KV cache of every row's first ``P - 1`` prompt tokens, computed once per distinct row and expanded to
    ``[B, ...]``; None when no row repeats."""
    rows, inverse = distinct_rows(input_ids, attention_mask)
    if rows.numel() == input_ids.size(0):
        return None
    ids, mask = input_ids[rows, :-1], attention_mask[rows, :-1]  # [U, P-1]
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)  # [U, P-1]: generation's own
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    cache = out.get("cache")  # transformers >= 5.24; before it the output field is past_key_values
    cache = out.get("past_key_values") if cache is None else cache
    if cache is None:  # the model returned no cache after all: TRL's prefill
        return None
    cache.batch_select_indices(inverse)  # [U, ...] -> [B, ...]
    return cache


def shared_prefill_generate(
    generate: Any, model: Any, trainer: Any = None, on_prefill: Callable[[], None] | None = None
) -> Any:
    """``model.generate`` with the prefill of repeated prompts done once (module docstring); with a ``trainer``, the
    prefill is timed as TRL times its phases (``profiling/Time taken: <Trainer>.slimrl.shared_prefill``);
    ``on_prefill()`` runs after each shared prefill (the caller's count)."""

    @functools.wraps(generate)
    def slimrl_generate_shared_prefill(*args, **kwargs):
        reason = why_not(model, args, kwargs)
        if reason is not None:
            _say_once(reason)
            return generate(*args, **kwargs)
        mask = kwargs.get("attention_mask")
        mask = torch.ones_like(kwargs["input_ids"]) if mask is None else mask
        timing = nullcontext()
        if trainer is not None:
            from trl.extras.profiling import profiling_context

            timing = profiling_context(trainer, "slimrl.shared_prefill")
        with timing:
            cache = prefill_once(model, kwargs["input_ids"], mask)
        if cache is None:
            return generate(*args, **kwargs)
        if on_prefill is not None:
            on_prefill()
        return generate(**{**kwargs, "attention_mask": mask, _cache_keyword(model): cache})

    return slimrl_generate_shared_prefill


@contextmanager
def shared_prefill(trainer: Any, on_prefill: Callable[[], None] | None = None) -> Iterator[None]:
    """For the duration, the generating model's ``generate`` shares the prefill of repeated prompts (an instance
    attribute, restored exactly after: another instance-level ``generate`` is wrapped, not replaced)."""
    model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    had = "generate" in vars(model)
    previous = vars(model).get("generate")
    model.generate = shared_prefill_generate(model.generate, model, trainer, on_prefill)
    try:
        yield
    finally:
        if had:
            model.generate = previous
        else:
            del model.generate
