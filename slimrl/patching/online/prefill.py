"""``_generate_single_turn`` of the online trainers (GRPO, RLOO): HF ``generate``'s prefill once per distinct prompt
with ``slimrl_shared_prefix`` (:mod:`slimrl.generation.shared_prefill`; vLLM paths, TRL's client and slimrl's
engine, are left alone: vLLM caches shared prefixes itself), all of it in malloc's recycling phase
(:func:`slimrl.compat.runtime.malloc.recycling_phase`: without it the KV cache's growth pays a page fault per fresh
page, measured +45 % generation time for RLOO on the CPU)."""

from __future__ import annotations

import functools
from typing import Any

from slimrl.compat.runtime.malloc import recycling_phase
from slimrl.generation.shared_prefill import shared_prefill
from slimrl.patching.every_trainer.extra_fields import fields_of
from slimrl.patching.every_trainer.state import trainer_state


def _count(trainer: Any) -> None:
    trainer_state(trainer).shared_prefills += 1


def generate_single_turn_factory(orig: Any) -> Any:
    """The trainer's ``_generate_single_turn`` in the recycling phase, inside :func:`shared_prefill` unless the
    field is off or vLLM generates."""

    @functools.wraps(orig)
    def slimrl_generate_single_turn(self, *args, **kwargs):
        with recycling_phase():
            if not fields_of(self.args).slimrl_shared_prefix or getattr(self, "use_vllm", False):
                return orig(self, *args, **kwargs)
            with shared_prefill(self, on_prefill=lambda: _count(self)):
                return orig(self, *args, **kwargs)

    return slimrl_generate_single_turn
