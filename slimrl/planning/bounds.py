"""What the planner agrees to trace: a config no GPU can hold, or deeper than any released decoder, is one line
before any meta model is built (the trace's cost grows with the layer count: a 20,000-layer config would take
hours), and so is a budget beyond any machine."""

from __future__ import annotations

from typing import Any

from slimrl.compat.gpus import GPUS
from slimrl.compat.quant import NF4_BYTES
from slimrl.errors import InputError

# the deepest released decoder LLMs have ~126 layers (Llama 3.1 405B); four times that is still traced in seconds
MAX_LAYERS = 512
MAX_BUDGET_BYTES = 2**50  # 1 PiB: beyond the memory of any single machine


def weights_lower_bound(config: Any) -> int:
    """Parameters the config implies at the least: per layer the query and output projections and two MLP matrices
    (``2 h (heads x head_dim + intermediate)``; experts multiply the MLP), plus one embedding (``vocab x h``)."""
    text = getattr(config, "text_config", None) or config
    h, layers, vocab = text.hidden_size, text.num_hidden_layers, text.vocab_size
    heads = getattr(text, "num_attention_heads", None) or 1
    head_dim = getattr(text, "head_dim", None) or h // heads
    inter = getattr(text, "moe_intermediate_size", None) or getattr(text, "intermediate_size", None) or h
    experts = max(1, getattr(text, "num_experts", None) or getattr(text, "num_local_experts", None) or 1)
    return layers * 2 * h * (heads * head_dim + experts * inter) + vocab * h


def check_plannable(config: Any, model: str, load_in_4bit: bool) -> None:
    """Raises :class:`InputError` (one line naming ``--model``) for a config the planner refuses to trace."""
    text = getattr(config, "text_config", None) or config
    if text.num_hidden_layers > MAX_LAYERS:
        raise InputError(
            f"--model {model}: {text.num_hidden_layers} layers is deeper than slimrl plans (at most "
            f"{MAX_LAYERS}; released decoders have under 130); check num_hidden_layers"
        )
    largest = max(GPUS, key=lambda g: g.total_bytes)
    per_param = NF4_BYTES if load_in_4bit else 2.0  # the smallest a GPU run can hold them in
    need = weights_lower_bound(config) * per_param
    if need > largest.total_bytes:
        raise InputError(
            f"--model {model}: its weights alone need at least {need / 2**30:,.0f} GiB "
            f"({'NF4' if load_in_4bit else '16-bit'}), more than the largest GPU slimrl knows holds "
            f"({largest.key}: {largest.total_bytes / 2**30:.0f} GiB); check the config"
            f"{'' if load_in_4bit else ' or pass --load_in_4bit true'}"
        )


def check_sequence_bound(config: Any, max_seq_length: int | None, prompt_and_completion: int) -> None:
    """``--max_seq_length``, where given, holds a prompt and its completion and fits the model's context (the
    engine's ``max_model_len``: vLLM refuses more than ``max_position_embeddings``), so the start check is judged
    on a length the engine can take; one line otherwise."""
    if max_seq_length is None:
        return
    context = getattr(getattr(config, "text_config", None) or config, "max_position_embeddings", None)
    if max_seq_length < prompt_and_completion or (context and max_seq_length > context):
        most = f" and at most the model's context, {context}" if context else ""
        raise InputError(
            f"--max_seq_length {max_seq_length}: the engine's longest sequence must hold "
            f"--max_prompt_length + --max_completion_length ({prompt_and_completion}){most}"
        )


def parse_budget(given: str | int | None) -> int | None:
    """``--budget`` in bytes (None: no budget); a value that is no size, or beyond any machine, is one line."""
    from slimrl.compat.memory import parse_bytes

    if given is None:
        return None
    try:
        budget_bytes = parse_bytes(given)
    except ValueError as err:
        raise InputError(str(err)) from None
    if budget_bytes > MAX_BUDGET_BYTES:
        raise InputError(
            f"--budget {given}: beyond any single machine's memory (at most 1 PiB); pass the memory "
            f"of the GPU or machine the run is for, e.g. 80GB"
        )
    return budget_bytes
