"""The ``__init__`` every patched trainer gets (one wrapper, registered for each trainer by
:mod:`slimrl.patching.table`), in this order, all before TRL builds anything:

1. legacy keywords translated (``tokenizer=`` and friends, :mod:`slimrl.patching.every_trainer.keywords`);
2. the inputs checked (:func:`check_trainer_inputs`): dataset rows and column layout, precision the user wrote;
   bitsandbytes 4-bit layers of the model and reference model kept trainable (:mod:`slimrl.models.quantized`);
3. the trainer's own hooks from its spec, each ``hook(model, args)`` (GRPO/RLOO: the ``max_seq_length`` budget,
   the engine's ``use_vllm`` default), then its auto-fit (GRPO/RLOO with ``slimrl_auto_fit``,
   :mod:`slimrl.patching.online.autofit`) with every argument;
4. ``push_to_hub=True`` with the Hub out of reach turned off, said in the changed-settings table
   (:mod:`slimrl.patching.every_trainer.hub_reach`); Python reward functions guarded
   (:mod:`slimrl.patching.every_trainer.reward_guard`);
5. TRL's ``__init__``; a LoRA adapter TRL put on the model (``peft_config=``) computed by slimrl's fused ops as
   ``get_peft_model``'s are (:func:`fuse_trl_adapter`); on CUDA Liger-Kernel's RMSNorm and RoPE on the model (and
   its SwiGLU where the fused MLP does not serve: :mod:`slimrl.models.liger`, removed by ``unpatch``); then the
   changed-defaults table (:mod:`slimrl.patching.every_trainer.defaults`);
6. the trainer's own after-hooks from its spec, each ``hook(trainer)`` (GRPO/RLOO: the run-health monitor,
   :mod:`slimrl.patching.online.health`).

A warning TRL's constructor attributes to its caller lands on this wrapper: it is issued at the user's line instead
(:func:`slimrl.compat.runtime.callsite.warnings_at_user_line`). TRL's own subclasses call their base's constructor
(``GKDTrainer`` -> ``SFTTrainer``): when both are patched, the outermost constructor (the class the user built) does
slimrl's work, and the base's wrapper only runs TRL's constructor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from slimrl.compat.runtime.callsite import warnings_at_user_line
from slimrl.models.quantized import keep_quantized_trainable
from slimrl.patching.every_trainer.defaults import print_changed_defaults
from slimrl.patching.every_trainer.hub_reach import skip_push_if_unreachable
from slimrl.patching.every_trainer.keywords import bound_inputs, translate_trainer_kwargs
from slimrl.patching.every_trainer.reward_guard import guard_reward_funcs
from slimrl.patching.every_trainer.state import trainer_state

Hook = Callable[[Any, Any], None]


def check_trainer_inputs(
    orig_init, args: tuple, kwargs: dict, trainer: str | None = None, layouts: Callable[[Any], tuple] | None = None
) -> None:
    """Before TRL builds the trainer: an empty (or split-dict) ``train_dataset``, one without a column layout the
    TRL trainer named ``trainer`` accepts (``layouts(args)``), and a model/config precision mismatch the user wrote
    are errors naming the fix (:mod:`slimrl.patching.every_trainer.validation`). With GRPO's ``environment_factory`` the
    columns are the environment's (TRL takes any, e.g. only ``environment``: each ``reset()`` returns the prompt), so
    the layout is left to TRL there."""
    from slimrl.patching.every_trainer.validation import check_dataset, check_layout, check_precision

    bound = bound_inputs(orig_init, args, kwargs)
    check_dataset(bound.get("train_dataset"))
    if layouts is not None and bound.get("environment_factory") is None:  # an environment's reset() gives the prompt
        check_layout(
            bound.get("train_dataset"),
            trainer,
            layouts(bound.get("args")),
            bound.get("args"),
            bound.get("formatting_func"),
        )
    check_precision(bound.get("model"), bound.get("args"))


def fuse_trl_adapter(trainer: Any) -> None:
    """The trainer's PEFT model computed by :func:`slimrl.models.fused_lora.fuse_lora` (the same math, less memory
    and traffic), unless it came from ``get_peft_model(..., fused_lora=False)``."""
    from slimrl.compat.model_state import model_state
    from slimrl.models.fused_lora import fuse_lora, is_fused

    model = getattr(trainer, "model", None)
    if isinstance(model, torch.nn.Module) and hasattr(model, "peft_config") and not is_fused(model):
        if model_state(model).fused_lora is not False:
            fuse_lora(model)


def apply_trainer_liger(trainer: Any) -> None:
    """Liger's kernels on the trainer's model where :func:`slimrl.models.liger.wanted` says so; its SwiGLU only where
    no MLP runs slimrl's fused MLP."""
    from slimrl.models.fused_lora import MLP_ATTR
    from slimrl.models.liger import apply_liger, wanted

    model = getattr(trainer, "model", None)
    if isinstance(model, torch.nn.Module) and wanted(model, getattr(trainer, "args", None)):
        apply_liger(model, swiglu=not any(getattr(m, MLP_ATTR, False) for m in model.modules()))


def trainer_init_factory(
    orig_init,
    hooks: tuple[Hook, ...] = (),
    fit: Callable[[dict], None] | None = None,
    algorithm: str = "",
    workload: Any = None,
    trainer: str | None = None,
    layouts: Callable[[Any], tuple] | None = None,
    after: tuple[Callable[[Any], None], ...] = (),
    guard_rewards: bool = True,
):
    """A trainer's ``__init__`` preceded by steps 1-4 of the module docstring and followed by step 6 (``after``);
    the trainer's state records which trainer it is (``algorithm``, and ``workload`` for the planner).
    ``guard_rewards=False``: reward functions reach TRL as given (trainers that ship them to other processes)."""

    @functools.wraps(orig_init)
    def slimrl_trainer_init(self, *args, **kwargs):
        state = trainer_state(self)
        state.constructed = True
        if state.building:  # a patched subclass's constructor did slimrl's work: the base's TRL constructor only
            return orig_init(self, *args, **kwargs)
        state.building = True
        try:
            with warnings_at_user_line():
                _build(self, args, kwargs)
        finally:
            state.building = False

    def _build(self, args: tuple, kwargs: dict) -> None:
        kwargs = translate_trainer_kwargs(type(self), orig_init, args, kwargs)
        check_trainer_inputs(orig_init, args, kwargs, trainer=trainer, layouts=layouts)
        bound = bound_inputs(orig_init, args, kwargs)  # every argument by name (positional ones too)
        for key in ("model", "ref_model"):
            if isinstance(bound.get(key), torch.nn.Module):
                keep_quantized_trainable(bound[key])
        for hook in hooks:
            hook(bound.get("model"), bound.get("args"))
        if fit is not None:
            fit(bound)
        skip_push_if_unreachable(bound.get("args"))
        if guard_rewards and bound.get("reward_funcs") is not None:  # GRPO, RLOO, OnlineDPO, XPO
            bound["reward_funcs"] = guard_reward_funcs(bound["reward_funcs"], bound.get("train_dataset"))
        state = trainer_state(self)
        state.algorithm, state.workload = algorithm, workload
        orig_init(self, **bound)
        fuse_trl_adapter(self)
        apply_trainer_liger(self)
        print_changed_defaults(getattr(self, "args", None))
        for hook in after:
            hook(self)

    return slimrl_trainer_init
