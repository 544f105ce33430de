"""Built-in task: seeded, disjoint splits, rewards that parse the final number and the tag."""

import re

import pytest

from slimrl.data import correctness_reward, format_reward, make_arithmetic_dataset
from slimrl.data.arithmetic import extract_answer


def _c(text):
    return [{"role": "assistant", "content": text}]


def test_dataset_is_seeded_and_well_formed():
    a, b = make_arithmetic_dataset(20, seed=1), make_arithmetic_dataset(20, seed=1)
    assert a["prompt"] == b["prompt"] and a["answer"] == b["answer"]
    assert make_arithmetic_dataset(20, seed=2)["prompt"] != a["prompt"]
    row = a[0]
    assert row["prompt"][-1]["role"] == "user" and "<answer>" in row["prompt"][1]["content"]
    assert extract_answer(row["prompt"][-1]["content"]) is not None  # the question holds its operands
    assert all(2 <= int(x) <= 40 for x in a["answer"])


def test_correctness_reward():
    completions = [
        _c("13 + 14 = 27. <answer>27</answer>"),
        _c("13 + 14 = 27"),
        _c("<answer>26</answer> 27"),
        _c("no idea"),
        "27",
    ]
    assert correctness_reward(completions, ["27"] * 5) == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_format_reward():
    completions = [_c("<answer>27</answer>"), _c("<answer>27</answer><answer>3</answer>"), _c("<answer>x"), _c("27")]
    assert format_reward(completions) == [0.5, 0.25, 0.25, 0.0]


@pytest.mark.parametrize("kind", ["paired", "unpaired", "sft"])
def test_preference_data_right_vs_wrong(kind):
    """Chosen/desirable completions are right and tagged; rejected/undesirable ones are not both."""
    from slimrl.data import correctness_reward, format_reward, make_preference_dataset

    ds = make_preference_dataset(40, kind=kind, seed=1)
    assert len(ds) == 40
    answers = [str(sum(int(x) for x in re.findall(r"\d+", r["prompt"][-1]["content"])[:2])) for r in ds]
    if kind == "paired":
        assert correctness_reward(ds["chosen"], answers) == [1.0] * 40
        assert format_reward(ds["chosen"]) == [0.5] * 40
        wrong = [c + f for c, f in zip(correctness_reward(ds["rejected"], answers), format_reward(ds["rejected"]))]
        assert all(w < 1.5 for w in wrong) and 0 < sum(correctness_reward(ds["rejected"], answers)) < 40
    elif kind == "unpaired":
        scores = correctness_reward(ds["completion"], answers)
        fmt = format_reward(ds["completion"])
        for s, f, good in zip(scores, fmt, ds["label"]):
            assert (s + f == 1.5) == good
        assert 0 < sum(ds["label"]) < 40
    else:
        assert correctness_reward(ds["completion"], answers) == [1.0] * 40
    assert make_preference_dataset(40, kind=kind, seed=1)[:] == ds[:]  # seeded
