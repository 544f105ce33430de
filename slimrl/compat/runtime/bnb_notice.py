"""bitsandbytes' notice about an optional CPU kernel, kept off slimrl users' screens.

PEFT imports bitsandbytes as it is imported (and transformers' Trainer imports PEFT), so on a CPU that reports
AVX512-BF16 every ``import slimrl``, ``slimrl --help`` and script printed, before anything of slimrl's,
``Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'``. That kernel only serves
bitsandbytes' eval-mode 4-bit inference path on a CPU, which slimrl turns off on every 4-bit layer
(:mod:`slimrl.models.quantized`: it has no gradient, and it repacks the weights the loss reads), so the notice is
about something slimrl never runs. This filter on bitsandbytes' own logger drops that one message; every other
record of bitsandbytes goes through as before.
"""

from __future__ import annotations

import logging

_LOGGER = "bitsandbytes.backends.cpu.ops"
_NOTICE = "Failed to load CPU gemm_4bit_forward"


def _not_the_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_NOTICE)


def drop_cpu_kernel_notice() -> None:
    """Install the filter (idempotent; before bitsandbytes is imported, or after)."""
    logger = logging.getLogger(_LOGGER)
    if _not_the_notice not in logger.filters:
        logger.addFilter(_not_the_notice)


drop_cpu_kernel_notice()  # on import: ``import slimrl`` imports this module first
