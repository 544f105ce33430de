"""The object TRL's GRPO/RLOO trainers talk to for generation, backed by the model's :class:`SlimrlEngine`.

TRL (``trl/generation/vllm_generation.py``) builds ``VLLMGeneration(model=..., mode="colocate", ...)`` when
``use_vllm=True`` and then calls only ``sync_weights()`` (once per optimizer step), ``generate(prompts, images,
num_generations, profiler)`` and reads ``.llm`` (for ``max_model_len``). The factory in
:mod:`slimrl.patching.online.engine_hooks` returns a
:class:`SlimrlVLLMGeneration` with that surface when the model carries a slimrl engine, else TRL's own class:

* ``sync_weights`` passes the current LoRA adapter to the engine as tensors under a new id (TRL's colocate path
  merges the adapter and pushes every base weight each step);
* ``generate`` samples with the trainer's settings (temperature, top_p, top_k, min_p, repetition_penalty,
  max_completion_length, ``generation_kwargs``) overlaid by the config's ``vllm_sampling_params`` (a seed there
  seeds each copy of a prompt apart: :func:`request_params`), returns the sampled tokens' log-probs for TRL's
  importance-sampling correction, then puts the engine in standby.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from slimrl.compat.runtime.callsite import warn
from slimrl.compat.sampling import user_sampling_kwargs

# Keys slimrl sets itself on every request: one completion per (already repeated) prompt, the sampled token's
# log-prob for TRL's importance-sampling correction.
_FIXED = {"n": 1, "logprobs": 0}


def engine_of(model: Any) -> Any:
    """The :class:`~slimrl.generation.engine.SlimrlEngine` attached to ``model`` or to a model it wraps (DDP's
    ``module``, PEFT's ``base_model`` and its tuner's ``model``: an adapter added with ``peft.get_peft_model``
    directly leaves the engine on the inner model)."""
    seen, todo = set(), [model]
    while todo:
        model = todo.pop(0)
        if model is None or id(model) in seen:
            continue
        seen.add(id(model))
        own = getattr(model, "__dict__", {})
        if own.get("vllm_engine") is not None:
            return own["vllm_engine"]
        inner = {**own, **own.get("_modules", {})}  # stored attributes and submodules: no attribute forwarding
        todo += [inner.get(name) for name in ("module", "base_model", "model")]
    return None


def sampling_kwargs(trainer_kwargs: dict, user_params: Any, max_completion_length: int) -> dict:
    """vLLM ``SamplingParams`` keywords: the trainer's, then ``vllm_sampling_params``'s, then slimrl's fixed ones.

    ``max_tokens`` is capped at ``max_completion_length`` (TRL pads and masks to that length).
    """
    kwargs = dict(trainer_kwargs)
    user = user_sampling_kwargs(user_params)
    for key in _FIXED:
        if key in user and user[key] != _FIXED[key]:
            warn(
                f"vllm_sampling_params: {key}={user[key]!r} is ignored (slimrl sets {key}={_FIXED[key]}: "
                f"TRL repeats each prompt num_generations times and needs the sampled token's log-prob)"
            )
        user.pop(key, None)
    kwargs.update(user)
    kwargs.update(_FIXED)
    kwargs["max_tokens"] = min(kwargs.get("max_tokens") or max_completion_length, max_completion_length)
    return kwargs


def request_params(prompts: list[list[int]], kwargs: dict, make: Any) -> Any:
    """The ``SamplingParams`` of each request: one for all, or — with a ``seed`` — one per request, the k-th copy of
    a prompt (on this rank) seeded ``seed + rank x len(prompts) + k``.

    TRL sends a group as ``num_generations`` copies of its prompt with ``n=1``, and vLLM seeds one generator per
    request: the user's seed on every copy (every Unsloth GRPO notebook sets ``seed=3407``) would draw one completion
    ``num_generations`` times, ``reward_std`` 0 and no gradient. vLLM's own ``n > 1`` request gives child ``k`` the
    seed ``seed + k`` (its ``ParallelSamplingProcessor``); this gives the copies the same seeds, so a seeded run
    samples a group of distinct draws and stays reproducible."""
    seed = kwargs.get("seed")
    if seed is None:
        return make(**kwargs)
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    seen: dict[tuple, int] = {}
    params = []
    for ids in prompts:
        k = seen.get(tuple(ids), 0)
        seen[tuple(ids)] = k + 1
        params.append(make(**{**kwargs, "seed": seed + rank * len(prompts) + k}))
    return params


def all_groups_identical(prompts: list[list[int]], completions: list[list[int]]) -> bool:
    """Whether every prompt sent more than once got the same completion every time (and one was): a batch whose
    groups have no spread at all — each gets ``reward_std`` 0, zero advantages and no gradient."""
    groups: dict[tuple, list] = {}
    for prompt, completion in zip(prompts, completions):
        groups.setdefault(tuple(prompt), []).append(tuple(completion))
    repeated = [group for group in groups.values() if len(group) > 1]
    return bool(repeated) and all(len(set(group)) == 1 for group in repeated)


class SlimrlVLLMGeneration:
    """TRL's ``VLLMGeneration`` surface (colocate mode) over a :class:`SlimrlEngine`."""

    said_identical = False  # the all-identical-groups line is said once per process

    def __init__(
        self,
        engine: Any,
        model: Any,
        accelerator: Any,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float | None = 0.0,
        repetition_penalty: float = 1.0,
        max_completion_length: int = 16,
        generation_kwargs: dict | None = None,
        structured_outputs_regex: str | None = None,
        sampling_params: Any = None,
        **_ignored: Any,
    ) -> None:
        self.engine = engine
        self.model = model
        self.accelerator = accelerator
        self.mode = "colocate"
        self.max_completion_length = max_completion_length
        base = {
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "min_p": 0.0 if min_p is None else min_p,
            "repetition_penalty": repetition_penalty,
            **(generation_kwargs or {}),
        }
        if structured_outputs_regex is not None:
            base["structured_outputs"] = {"regex": structured_outputs_regex}
        self.sampling = sampling_kwargs(base, sampling_params, max_completion_length)

    @property
    def llm(self) -> Any:
        return self.engine.start(self._peft_model())

    def _peft_model(self) -> Any:
        return self.accelerator.unwrap_model(self.model) if self.accelerator is not None else self.model

    def sync_weights(self) -> None:
        """Give the engine the current adapter (tensors, new id); no merge, no base-weight copy."""
        self.engine.load_adapter(self._peft_model())

    def generate(self, prompts: list[list[int]], images: Any, num_generations: int, profiler: Any = None) -> tuple:
        """(prompt_ids, completion_ids, logprobs [B][T][1], logprob_token_ids [B][T][1]) as TRL's colocate path."""
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        if images is not None and any(img is not None for img in images):
            raise NotImplementedError(
                "slimrl's engine generates from text prompts only; for a vision-language "
                "model pass fast_inference=False (TRL's own vLLM path then applies)"
            )
        if self.engine.lora_request is None:
            self.sync_weights()
        kwargs = dict(self.sampling)
        if isinstance(kwargs.get("structured_outputs"), dict):
            kwargs["structured_outputs"] = StructuredOutputsParams(**kwargs["structured_outputs"])
        with profiler or nullcontext():
            outputs = self.engine.generate_ids(prompts, request_params(prompts, kwargs, SamplingParams))
        self.engine.standby()
        from trl.generation.vllm_generation import extract_logprobs

        prompt_ids = [o.prompt_token_ids for o in outputs]
        completion_ids = [list(c.token_ids) for o in outputs for c in o.outputs]
        if not SlimrlVLLMGeneration.said_identical and all_groups_identical(prompt_ids, completion_ids):
            SlimrlVLLMGeneration.said_identical = True
            shown = {k: self.sampling.get(k) for k in ("temperature", "top_k", "top_p", "min_p", "seed")}
            warn(
                f"every prompt's {num_generations} completions in this generation batch were identical, so each group "
                f"has reward_std 0 and teaches nothing; these sampling settings draw one completion ({shown}): raise "
                f"temperature, set top_k=0 (or above 1), and check vllm_sampling_params"
            )
        logprobs, logprob_token_ids = extract_logprobs(outputs)
        return prompt_ids, completion_ids, logprobs, logprob_token_ids
