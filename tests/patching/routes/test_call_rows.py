"""A log-prob call's row facts: the values the layouts need, read once; shared by calls on the same tensors."""

from __future__ import annotations

import torch

from slimrl.patching.routes.call_rows import CallRows, row_facts

# two rows, prompt width 3, completion width 4: left-padded prompts then completions
IDS = torch.tensor([[0, 5, 6, 7, 8, 9, 0], [4, 5, 6, 1, 2, 3, 4]])
MASK = torch.tensor([[0, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]])


def test_facts_of_well_formed_rows():
    facts = row_facts(IDS, MASK, 4)
    assert facts.lengths == [2, 4] and facts.ones == [2, 4] and facts.n_prompt == [2, 3]
    assert facts.prompts == [(5, 6), (4, 5, 6)] and facts.well_formed


def test_a_hole_in_a_completion_or_an_empty_prompt_is_not_well_formed():
    hole = MASK.clone()
    hole[1, 4] = 0  # a masked tool token inside the completion
    facts = row_facts(IDS, hole, 4)
    assert facts.lengths == [2, 4] and facts.ones == [2, 3] and not facts.well_formed
    no_prompt = MASK.clone()
    no_prompt[0, :3] = 0
    assert not row_facts(IDS, no_prompt, 4).well_formed
    right_padded = MASK.clone()
    right_padded[0, :3] = torch.tensor([1, 1, 0])
    assert not row_facts(IDS, right_padded, 4).well_formed


def test_calls_on_the_same_unchanged_tensors_share_one_read(monkeypatch):
    from slimrl.patching.routes import call_rows

    reads = []
    real = call_rows.row_facts
    monkeypatch.setattr(call_rows, "row_facts", lambda *a: reads.append(1) or real(*a))
    monkeypatch.setattr(call_rows, "_LAST", [])
    ids, mask = IDS.clone(), MASK.clone()
    first = CallRows(ids, mask, 4)
    assert not first.read
    assert first.facts.lengths == [2, 4] and first.read
    assert CallRows(ids, mask, 4).facts is first.facts  # TRL's old-policy then reference call
    assert CallRows(ids[0:2], mask[0:2], 4).facts is first.facts  # the same rows, through a view
    assert len(reads) == 1
    mask[0, 5] = 1  # changed in place: its version moves on, read again
    assert CallRows(ids, mask, 4).facts.lengths == [3, 4]
    assert len(reads) == 2
    assert CallRows(ids[0:1], mask[0:1], 4).facts.lengths == [3]  # other rows: read
    assert CallRows(ids.clone(), mask.clone(), 4).facts.lengths == [3, 4]  # equal values, other tensors: read
    assert len(reads) == 4
