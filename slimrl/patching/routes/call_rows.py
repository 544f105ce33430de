"""What the host must know of a log-prob call's rows to lay out its forwards, read from the device once.

The length groups (:mod:`slimrl.patching.routes.method_capture`) cut each forward after its longest completion and
the shared-prefix layout (:mod:`slimrl.patching.routes.shared_prefix`) groups rows by prompt: both choose shapes, so
both need values on the host. They are computed on the device and read in one transfer
(:func:`slimrl.compat.host_transfer.read_together`), once per call and only when a layout asks for them, so a call
costs one host sync where reading each value where it is used cost seven, and none when it gets the tensors the
previous call read (TRL's old-policy and reference calls share them).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property

import torch

from slimrl.compat.host_transfer import read_together


@dataclass(frozen=True)
class RowFacts:
    """Per row of ``[B, P + C]`` masks: ``lengths`` (1 + the index of the last real completion token, 0 for an empty
    completion), ``ones`` (real completion tokens), ``n_prompt`` (real prompt tokens), ``prompts`` (those tokens),
    and ``well_formed``: every row is one left-padded prompt of at least one token, then ``lengths[i]`` real
    completion tokens with no hole."""

    lengths: list[int]
    ones: list[int]
    n_prompt: list[int]
    prompts: list[tuple[int, ...]]
    well_formed: bool


def row_facts(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> RowFacts:
    """:class:`RowFacts` of one call, in one device -> host transfer."""
    prompt_width = input_ids.size(1) - logits_to_keep
    pm = attention_mask[:, :prompt_width].bool()  # [B, P]
    cm = attention_mask[:, prompt_width:].bool()  # [B, C]
    last = logits_to_keep - cm.flip(-1).int().argmax(-1)  # [B]
    lengths = torch.where(cm.any(-1), last, 0)  # [B]
    n_prompt = pm.sum(-1)  # [B]
    cols = torch.arange(prompt_width, device=pm.device)  # [P]
    left_padded = (pm == (cols[None, :] >= prompt_width - n_prompt[:, None])).all(-1)  # [B]
    in_order = (cm == (torch.arange(logits_to_keep, device=cm.device)[None, :] < lengths[:, None])).all(-1)  # [B]
    ok = left_padded & in_order & (n_prompt > 0)  # [B]
    lengths_h, ones_h, n_prompt_h, ok_h, ids_h = read_together(
        [lengths, cm.sum(-1), n_prompt, ok, input_ids[:, :prompt_width]]
    )
    prompts = [tuple(ids[prompt_width - n :]) for ids, n in zip(ids_h, n_prompt_h, strict=True)]
    return RowFacts(lengths_h, ones_h, n_prompt_h, prompts, all(ok_h))


_LAST: list[tuple] = []  # (the last read's tensors as (weakref, place), logits_to_keep, facts)


def _where(t: torch.Tensor) -> tuple:
    """A tensor as (weak reference to the tensor owning its memory, the view's place in it and its version): equal
    for two views only while they show the same, unchanged elements (the owner is alive, so its memory is not
    another tensor's)."""
    root = t._base if t._base is not None else t
    return weakref.ref(root), (t.storage_offset(), tuple(t.shape), t.stride(), t._version)


def _same(a: tuple, b: tuple) -> bool:
    return a[0]() is not None and a[0]() is b[0]() and a[1] == b[1]


def _remembered(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> RowFacts | None:
    """The facts of the last read when this call has the same rows of the very same tensors, unchanged since: TRL
    passes one pair to its old- and reference-policy calls."""
    if not _LAST:
        return None
    ids, mask, keep, facts = _LAST[0]
    same = _same(ids, _where(input_ids)) and _same(mask, _where(attention_mask)) and keep == logits_to_keep
    return facts if same else None


class CallRows:
    """A call's masks with their :class:`RowFacts` read on first use (a call whose layouts are off reads nothing)."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> None:
        self.input_ids, self.attention_mask, self.logits_to_keep = input_ids, attention_mask, logits_to_keep

    @property
    def read(self) -> bool:
        """Whether the facts are on the host already."""
        return "facts" in self.__dict__

    @cached_property
    def facts(self) -> RowFacts:
        ids, mask, keep = self.input_ids, self.attention_mask, self.logits_to_keep
        facts = _remembered(ids, mask, keep)
        if facts is None:
            facts = row_facts(ids, mask, keep)
            _LAST[:] = [(_where(ids), _where(mask), keep, facts)]
        return facts
