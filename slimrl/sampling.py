"""``vLLMSamplingParams``: vLLM's ``SamplingParams`` when vLLM is installed; the keyword arguments are remembered."""

from __future__ import annotations

from typing import Any


class _RecordedSamplingParams(dict):
    """Stand-in used when vLLM is not installed: a dict of the keyword arguments, readable as attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def vLLMSamplingParams(**kwargs: Any) -> Any:  # noqa: N802
    """Build ``vllm.SamplingParams(**kwargs)``; the kwargs are kept on ``._slimrl_kwargs`` (or, without vLLM,
    returned as a dict-like record) so the trainer can apply them to any generation back end."""
    try:
        from vllm import SamplingParams
    except ImportError:
        return _RecordedSamplingParams(kwargs)
    params = SamplingParams(**kwargs)
    try:
        params._slimrl_kwargs = dict(kwargs)
    except AttributeError:  # msgspec structs may refuse new attributes
        pass
    return params
