"""``slimrl verify`` / ``slimrl.verify(...)``: prove on your own setup that the patch is exact.

For each trainer the installed TRL has (or the ones asked for) and each of its loss types, the same small training
run (:mod:`slimrl.verify.scenarios`: two SGD steps from one seed) is done twice in this process, first with TRL
alone (``unpatch``), then with slimrl patched, on a tiny random model built from your model's config (same
architecture, vocabulary, head tying and soft-capping; 2 layers, narrow; :mod:`slimrl.verify.tiny`) or on the real
model (``full=True``). Compared, as relative errors ``|a - b| / |b|`` (L2 norms): the logged losses (worst step),
the gradient of every parameter at the first step (worst parameter), and the whole update after the two steps (all
trainable parameters as one vector: step two's gradient is taken at slightly different weights, so a parameter whose
two steps nearly cancel would magnify rounding in a per-parameter ratio). A row passes when all three are within the
tolerance the project's own parity tests use. GRPO also gets the agentic rows ``tools``, ``environment`` and
``rollout_func`` (:mod:`slimrl.verify.agentic`: scripted multi-turn rollouts, the same on both sides). For GRPO and
RLOO the patched run also checks that the generator
sampled from the model being trained (:mod:`slimrl.verify.generation`: the largest difference between the log-prob
the generator gave a sampled token and the training model's, within :data:`GEN_TOLERANCE`).

``fast_inference=True`` / ``vllm_server_base_url=URL`` add, for GRPO and RLOO, a row whose patched run generates
through slimrl's colocated vLLM engine (the tiny model saved and loaded with ``FastLanguageModel(...,
fast_inference=True)``) or a running vLLM server (the model in ``model``, a local directory the server serves): TRL
alone cannot generate the same samples there, so those rows check the generator only.

``load_in_4bit=True`` (``load_in_8bit``) runs the LoRA scenarios (GRPO, RLOO, OnlineDPO, XPO) on a base quantized by
bitsandbytes the way users load one (on the CPU with bitsandbytes >= 0.50, or CUDA); each step generates before the
compared backward, so a quantized layer that generation leaves without a gradient fails the row.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from slimrl.errors import InputError
from slimrl.patching.every_trainer.extra_fields import EXTRA_FIELDS
from slimrl.verify.rows import (  # noqa: F401 - the public names of slimrl.verify
    GEN_REASON,
    GEN_REASON_VLLM,
    GEN_TOLERANCE,
    GEN_TOLERANCE_VLLM,
    REASON,
    TOLERANCE,
    Row,
    compare,
    generation_row,
    probed,
    rounding_exposure,
)
from slimrl.verify.scenarios import Setup, UnquantizableError, loss_types
from slimrl.verify.setup import make_setup
from slimrl.verify.table import format_table


def verify(
    algorithms: list[str] | None = None,
    loss_type: str | None = None,
    model: str | None = None,
    full: bool = False,
    device: str = "cpu",
    progress=None,
    load_in_4bit: bool = False,
    load_in_8bit: bool = False,
    fast_inference: bool = False,
    vllm_server_base_url: str | None = None,
    unsloth_num_chunks: int | None = None,
) -> list[Row]:
    """Rows for every (trainer, loss type) asked for (default: every trainer the installed TRL has). ``model``: a
    model directory, .gguf or hub id whose config the tiny model copies (``full=True``: the model itself);
    ``device``: "cpu" (fp32) or "cuda" (bf16); ``load_in_4bit`` / ``load_in_8bit``: a bitsandbytes-quantized base
    (the LoRA scenarios only); ``fast_inference`` / ``vllm_server_base_url``: also the generator rows of GRPO and
    RLOO (see the module docstring); ``unsloth_num_chunks``: set on every scenario's config (slimrl's own op then
    projects where TRL's Triton kernel would). ``progress(row)`` is called after each row."""
    import datasets

    from slimrl.patching import _normalise, trainer_and_config, trainer_available
    from slimrl.patching.table import every_trainer

    datasets.disable_progress_bars()
    if load_in_4bit and load_in_8bit:
        raise InputError("--load_in_4bit and --load_in_8bit: pass one of them")
    quantized = "4bit" if load_in_4bit else "8bit" if load_in_8bit else None
    if unsloth_num_chunks is not None:  # the field's own check, where it is declared
        try:
            EXTRA_FIELDS["unsloth_num_chunks"].check("--unsloth_num_chunks", unsloth_num_chunks)
        except ValueError as err:
            raise InputError(str(err)) from None
    trainers = every_trainer()  # the table and the installed TRL's other trainers (those inheriting a route verify)
    names = (
        [n for n in trainers if trainer_available(n) and trainers[n].about.scenario]
        if not algorithms
        else [_checked_name(a, _normalise, trainer_available, trainers) for a in algorithms]
    )
    if vllm_server_base_url is not None and (model is None or not Path(model).is_dir()):
        raise InputError(
            "--vllm_server_base_url: pass --model DIR, the local model directory the server serves "
            "(the trained model must hold the server's weights)"
        )
    if vllm_server_base_url is not None:
        from slimrl.verify.server_check import server_problem

        problem = server_problem(vllm_server_base_url)
        if problem:
            raise InputError(f"--vllm_server_base_url: {problem}")
    if fast_inference:
        from slimrl.generation import vllm_status

        if vllm_status() is not None:
            raise InputError(f"--fast_inference: {vllm_status()}")
    setup = make_setup(model, full, device, quantized)
    if unsloth_num_chunks is not None:
        setup.slimrl_fields["unsloth_num_chunks"] = unsloth_num_chunks
    rows = []
    for name in names:
        types = loss_types(name, trainer_and_config(name)[1])
        if loss_type is not None:
            if loss_type not in types:
                raise InputError(f"--loss_type {loss_type}: {name} has {', '.join(types)}")
            types = [loss_type]
        for lt in types:
            try:
                row = compare(name, lt, setup)
            except UnquantizableError as err:  # before any compute: the scenario's first model
                if algorithms:
                    raise InputError(
                        f"--load_in_{quantized}: {name}: {err}; the LoRA trainers' rows run on a quantized base"
                    ) from None
                break
            rows.append(row)
            if progress is not None:
                progress(row)
    for row in _generator_rows(
        [n for n in names if n in probed()], loss_type, setup, fast_inference, vllm_server_base_url, model
    ):
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def _generator_rows(
    names: list[str],
    loss_type: str | None,
    setup: Setup,
    fast_inference: bool,
    server_url: str | None,
    model: str | None,
):
    """The engine and server rows (one per trainer: ``loss_type`` if it has it, else its first), made lazily."""
    import dataclasses

    from slimrl.patching import trainer_and_config

    wanted = (["engine"] if fast_inference else []) + (["server"] if server_url else [])
    for generator in wanted:
        with tempfile.TemporaryDirectory(prefix="slimrl-verify-weights-") as tmp:
            weights = model if generator == "server" else _save_tiny(setup, tmp)
            # three steps, each generating (one iteration per generation): steps two and three sample after an
            # update, so a generator that missed the adapter sync fails
            gen_setup = dataclasses.replace(
                setup,
                generator=generator,
                weights=weights,
                server_url=server_url,
                overrides={"max_steps": 3, "num_iterations": 1},
            )
            for name in names:
                types = loss_types(name, trainer_and_config(name)[1])
                yield generation_row(name, loss_type if loss_type in types else types[0], gen_setup)


def _save_tiny(setup: Setup, directory: str) -> str:
    """The scenarios' tiny model (seed 0) and tokenizer written to ``directory`` for the engine to load, with
    attention heads of 32 (vLLM's CPU attention has no kernel for smaller heads)."""
    import copy

    from slimrl.verify.tiny import build

    config = copy.deepcopy(setup.config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = max(1, text.hidden_size // 32)
    text.num_attention_heads = heads
    if getattr(text, "num_key_value_heads", None) is not None:
        text.num_key_value_heads = heads
    if getattr(text, "head_dim", None) is not None:
        text.head_dim = text.hidden_size // heads
    build(config, 0, dtype=setup.dtype).save_pretrained(directory)
    setup.tokenizer.save_pretrained(directory)
    return directory


def _checked_name(algorithm: str, normalise, available, trainers: dict) -> str:
    try:
        name = normalise(algorithm)
    except ValueError as err:
        raise InputError(f"--algorithm {algorithm}: {err}") from None
    if trainers[name].about.scenario is None:
        verifiable = [n for n, spec in trainers.items() if spec.about.scenario]
        raise InputError(
            f"--algorithm {algorithm}: not verified ({trainers[name].about.not_verified}); "
            f"verifiable: {', '.join(verifiable)}"
        )
    if not available(name):
        raise InputError(f"--algorithm {algorithm}: the installed TRL has no such trainer")
    return name


__all__ = ["verify", "format_table", "compare", "make_setup", "Row", "TOLERANCE", "GEN_TOLERANCE"]
