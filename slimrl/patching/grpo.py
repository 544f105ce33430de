"""Patches for TRL's ``GRPOTrainer`` / ``GRPOConfig`` (declared here, installed by :mod:`slimrl.patching`).

| TRL attribute                                    | replaced by                                  |
|--------------------------------------------------|----------------------------------------------|
| ``GRPOTrainer.__init__``                         | :func:`slimrl_grpo_init` (checks first)       |
| ``GRPOTrainer._get_per_token_logps_and_entropies`` | :func:`slimrl_get_per_token_logps_and_entropies` |
| ``GRPOTrainer.training_step``                    | :func:`slimrl_training_step` (adds metrics)   |
| ``GRPOConfig.__init__``                          | :func:`slimrl_config_init` (extra fields)     |
| ``grpo_trainer.unwrap_model_for_generation``     | :func:`slimrl_unwrap_model_for_generation`    |
| ``grpo_trainer.VLLMGeneration``                  | the fast_inference engine (:mod:`slimrl.patching.generation`) |

The loss itself stays TRL's ``_compute_loss`` (every ``loss_type`` the installed release offers: grpo, bnpo,
dr_grpo, dapo, cispo, luspo, sapo, vespo in 1.16), fed with log-probs from :mod:`slimrl.ops`.
"""

from __future__ import annotations

import functools
import time
from contextlib import contextmanager, nullcontext

import torch

from slimrl.compat.heads import capture_head_input, logit_transform, plain_linear_head
from slimrl.compat.malloc import recycling_phase
from slimrl.compat.memory import peak_window
from slimrl.models.checkpointing import align_trainer_checkpointing
from slimrl.models.modes import for_inference, for_training
from slimrl.ops.chunked_logprob import masked_token_logprobs
from slimrl.patching.config_fields import ALL_FIELDS, config_init_factory, config_patches, generation_config_checks
from slimrl.patching.defaults import print_changed_defaults
from slimrl.patching.generation import apply_engine_defaults, log_engine_metrics, slimrl_vllm_generation_factory
from slimrl.patching.guards import check_finite_step, count_skipped_scaler_step
from slimrl.patching.legacy import check_trainer_inputs, translate_trainer_kwargs
from slimrl.patching.registry import Patch, original, register
from slimrl.patching.rewards import guard_reward_funcs
from slimrl.patching.validation import check_batch_length, check_sequence_budget

TRAINER = "trl.trainer.grpo_trainer:GRPOTrainer"
CONFIG = "trl.trainer.grpo_config:GRPOConfig"
MODULE = "trl.trainer.grpo_trainer"

def slimrl_config_init_factory(orig_init, fields=ALL_FIELDS):
    """``GRPOConfig.__init__`` that also accepts slimrl's fields (:mod:`slimrl.patching.config_fields`:
    ``unsloth_num_chunks``, ``unsloth_logit_chunk_multiplier``, ``unsloth_grpo_mini_batch``, ``max_seq_length``),
    ``vllm_sampling_params`` and the legacy ``max_new_tokens`` (:mod:`slimrl.patching.legacy`), and checks the
    keywords first (:func:`slimrl.patching.validation.check_grpo_config_kwargs`)."""
    return config_init_factory(orig_init, check=generation_config_checks, extra_attributes=("vllm_sampling_params",),
                               fields=fields)


def _has_extra_inputs(kwargs: dict) -> bool:
    return any(v is not None for v in kwargs.values())


def slimrl_get_per_token_logps_and_entropies(
    self,
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    batch_size: int | None = None,
    compute_entropy: bool = False,
    compute_aux_loss: bool = False,
    **multimodal,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Per-token log-probs ``[B, C]`` (and entropies ``[B, C]``) of the completion tokens via :mod:`slimrl.ops`.

    Same contract as TRL's method (all three call sites: policy with grad on the wrapped model, old and reference
    passes without grad in rows of ``batch_size``): log-probs of ``softmax(logits / self.temperature)`` with the
    model's logit scaling/soft-capping, 0 at padded positions. The wrapped ``model`` is called (so DDP/accelerate
    hooks run) with ``logits_to_keep = C + 1``; its LM head input is captured and projected chunk by chunk, only at
    real completion positions. The entropy carries gradient (needed by TRL's entropy bonus).

    Delegates to TRL's own method for cases the capture cannot serve: vision-language inputs, MoE aux loss,
    and heads that are not plain ``nn.Linear`` (LoRA on the head, ZeRO-3 partitioned, quantized).
    """
    return logps_and_entropies_through_ops(TRAINER, self, model, input_ids, attention_mask, logits_to_keep,
                                           batch_size, compute_entropy, compute_aux_loss, **multimodal)


def logps_and_entropies_through_ops(target: str, self, model, input_ids, attention_mask, logits_to_keep,
                                    batch_size=None, compute_entropy=False, compute_aux_loss=False, **multimodal):
    """Body of :func:`slimrl_get_per_token_logps_and_entropies` for any trainer with TRL's GRPO contract
    (``target`` names the class whose original method serves the cases the capture cannot)."""
    unwrapped = self.accelerator.unwrap_model(model)
    head = plain_linear_head(unwrapped)
    if head is None or compute_aux_loss or _has_extra_inputs(multimodal):
        fn = original(target, "_get_per_token_logps_and_entropies")
        return fn(self, model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                  compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)

    # No-grad passes (old / reference log-probs) keep nothing alive between layers: let malloc recycle blocks.
    with nullcontext() if torch.is_grad_enabled() else recycling_phase():
        return _logps_through_ops(self, model, unwrapped.config, head, input_ids, attention_mask, logits_to_keep,
                                  batch_size, compute_entropy)


def _logps_through_ops(self, model, config, head, input_ids, attention_mask, logits_to_keep, batch_size,
                       compute_entropy):
    """The capture + :mod:`slimrl.ops` path of :func:`slimrl_get_per_token_logps_and_entropies`."""
    check_batch_length(self.model, input_ids.size(1))
    scale, softcap = logit_transform(config)
    num_chunks = getattr(self.args, "unsloth_num_chunks", -1)
    batch_size = batch_size or input_ids.size(0)
    mini = getattr(self.args, "unsloth_grpo_mini_batch", None)
    if mini and not torch.is_grad_enabled():  # no-grad passes: fewer rows per forward, lower activation peak
        batch_size = min(batch_size, mini)
    all_logps, all_entropies = [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids = input_ids[start:start + batch_size]  # [b, P + C]
        mask = attention_mask[start:start + batch_size]  # [b, P + C]
        with capture_head_input(head) as captured, self.accelerator.autocast():
            model(input_ids=ids, attention_mask=mask, logits_to_keep=logits_to_keep + 1, use_cache=False)
        hidden = captured[-1][:, :-1]  # [b, C, H]: position t predicts token t + 1
        targets = ids[:, -logits_to_keep:]  # [b, C]
        valid = mask[:, -logits_to_keep:].bool()  # [b, C]
        weight, bias = head.weight, head.bias
        if hasattr(weight, "full_tensor"):  # FSDP2 DTensor
            weight = weight.full_tensor()
            bias = bias.full_tensor() if bias is not None else None
        # The head math runs in the head's dtype with fp32 softmax, outside autocast.
        autocast_off = torch.autocast(hidden.device.type, enabled=False) if hidden.device.type in ("cuda", "cpu") \
            else nullcontext()
        with autocast_off:
            logps, entropy = masked_token_logprobs(
                hidden.to(weight.dtype), weight, targets, valid, bias, self.temperature,
                num_chunks=num_chunks, chunk_multiplier=getattr(self.args, "unsloth_logit_chunk_multiplier", None),
                logit_scale=scale, softcap=softcap, with_entropy=compute_entropy,
            )
        all_logps.append(logps)
        if compute_entropy:
            all_entropies.append(entropy)
        if torch.is_grad_enabled():
            self._slimrl_trained_tokens = getattr(self, "_slimrl_trained_tokens", 0) + int(valid.sum())
    entropies = torch.cat(all_entropies, dim=0) if compute_entropy else None
    return torch.cat(all_logps, dim=0), entropies, None


def slimrl_training_step(self, model, inputs, num_items_in_batch=None):
    """TRL's ``training_step`` plus two metrics: ``memory/peak_mb`` and ``tokens_per_s``, and a stop on a non-finite
    loss or gradient (:func:`slimrl.patching.guards.check_finite_step`).

    ``memory/peak_mb``: the peak memory of the whole step, generation included (CUDA: allocated bytes; CPU: the
    process's peak resident set), read through :func:`slimrl.compat.memory.peak_window`, which the engine's
    standby/resume resets cannot shorten. ``tokens_per_s``: completion tokens trained in the step / step wall time
    (generation included).
    """
    count_skipped_scaler_step(self)
    self._slimrl_trained_tokens = 0
    t0 = time.perf_counter()
    with peak_window(self.accelerator.device) as window:
        out = original(TRAINER, "training_step")(self, model, inputs, num_items_in_batch)
    check_finite_step(self, model, out)  # before the optimizer can apply a NaN/inf update
    dt = time.perf_counter() - t0
    mode = "train" if self.model.training else "eval"
    self._metrics[mode]["memory/peak_mb"].append(window.peak_bytes() / 2**20)
    self._metrics[mode]["tokens_per_s"].append(self._slimrl_trained_tokens / dt if dt > 0 else 0.0)
    log_engine_metrics(self)  # fast_inference engine: phase peaks, sync time (slimrl.patching.generation)
    return out


def slimrl_grpo_init_factory(orig_init):
    """``GRPOTrainer.__init__`` preceded by legacy keyword translation (``tokenizer=``, :mod:`slimrl.patching.legacy`),
    the checks that need no compute (sequence budget vs ``max_seq_length``, dataset, precision), guarded reward
    functions (:mod:`slimrl.patching.rewards`) and by aligning the config's checkpointing with the model's (offload
    on CUDA)."""

    @functools.wraps(orig_init)
    def slimrl_grpo_init(self, *args, **kwargs):
        kwargs = translate_trainer_kwargs(type(self), orig_init, args, kwargs)
        model = kwargs.get("model", args[0] if args else None)
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        check_sequence_budget(model, config)
        check_trainer_inputs(orig_init, args, kwargs, trainer=type(self))
        apply_engine_defaults(model, config)  # fast_inference engine -> use_vllm (slimrl.patching.generation)
        if "reward_funcs" in kwargs:
            kwargs["reward_funcs"] = guard_reward_funcs(kwargs["reward_funcs"])
        align_trainer_checkpointing(model, config)  # keep get_peft_model's offload choice when TRL re-enables it
        orig_init(self, *args, **kwargs)
        print_changed_defaults(self.args)

    return slimrl_grpo_init


def slimrl_unwrap_for_generation_factory(orig_cm):
    """TRL's ``unwrap_model_for_generation`` (as imported by the GRPO trainer module) with the model switched by
    ``FastLanguageModel.for_inference`` for the generation and back by ``for_training`` (exactly), inside
    :func:`slimrl.compat.malloc.recycling_phase` (host allocator set for the KV cache's growth)."""

    @contextmanager
    @functools.wraps(orig_cm)
    def slimrl_unwrap_model_for_generation(*args, **kwargs):
        with recycling_phase(), orig_cm(*args, **kwargs) as unwrapped:
            for_inference(unwrapped)
            try:
                yield unwrapped
            finally:
                for_training(unwrapped)

    return slimrl_unwrap_model_for_generation


PATCHES = [
    register(Patch("grpo", TRAINER, "__init__", slimrl_grpo_init_factory, wrap=True)),
    register(Patch("grpo", TRAINER, "_get_per_token_logps_and_entropies", slimrl_get_per_token_logps_and_entropies)),
    register(Patch("grpo", TRAINER, "training_step", slimrl_training_step)),
    *(register(p) for p in config_patches("grpo", CONFIG, init=slimrl_config_init_factory)),
    register(Patch("grpo", MODULE, "unwrap_model_for_generation", slimrl_unwrap_for_generation_factory, wrap=True)),
    register(Patch("grpo", MODULE, "VLLMGeneration", slimrl_vllm_generation_factory, wrap=True, optional=True)),
]
