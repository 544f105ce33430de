"""Seeded arithmetic problems and their two rewards (the embedded default task of ``slimrl train``).

Each row: ``prompt`` (a chat whose worked example answers inside ``<answer>...</answer>``) and ``answer`` (the
integer as a string). Train and held-out eval splits come from different seeds.
"""

from __future__ import annotations

import random
import re
from typing import Any

ANSWER_TAG = "answer"
_TAGGED = re.compile(rf"<{ANSWER_TAG}>\s*(-?\d+)\s*</{ANSWER_TAG}>")
_NUMBER = re.compile(r"-?\d+")

_QUESTIONS = ("What is {a} + {b}?", "What is {a} plus {b}?", "Compute {a} + {b}.", "Add {a} and {b}.")
# One worked example in the chat history shows the answer format: SmolLM2-135M then uses the tag in about a
# sixth of sampled answers (none with an instruction alone), which gives GRPO a signal to reinforce.
EXAMPLE = [
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": f"3 + 4 = 7. <{ANSWER_TAG}>7</{ANSWER_TAG}>"},
]


def make_arithmetic_dataset(n: int, seed: int = 3407, max_operand: int = 20) -> Any:
    """``n`` problems ``a + b`` (1 <= a, b <= max_operand) as a ``datasets.Dataset`` with prompt/answer columns.

    ``prompt`` is a chat: one worked example (user question, assistant answer ending in ``<answer>7</answer>``)
    and the new question.
    """
    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, max_operand), rng.randint(1, max_operand)
        question = rng.choice(_QUESTIONS).format(a=a, b=b)
        rows.append({"prompt": [*EXAMPLE, {"role": "user", "content": question}], "answer": str(a + b)})
    return Dataset.from_list(rows)


def _text(completion: Any) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else str(completion)


def extract_answer(text: str) -> str | None:
    """The tagged number if present, else the last number in the text."""
    tagged = _TAGGED.findall(text)
    if tagged:
        return tagged[-1]
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def correctness_reward(completions: list, answer: list[str], **kwargs: Any) -> list[float]:
    """1.0 when the final number (tagged, else last) equals the answer, else 0.0."""
    return [1.0 if extract_answer(_text(c)) == a else 0.0 for c, a in zip(completions, answer)]


def format_reward(completions: list, **kwargs: Any) -> list[float]:
    """0.5 for exactly one ``<answer>N</answer>``, 0.25 for any other use of the tag, else 0."""
    out = []
    for c in completions:
        text = _text(c)
        if len(_TAGGED.findall(text)) == 1:
            out.append(0.5)
        elif f"<{ANSWER_TAG}>" in text:
            out.append(0.25)
        else:
            out.append(0.0)
    return out


def make_preference_dataset(n: int, kind: str = "paired", seed: int = 3407, max_operand: int = 20) -> Any:
    """Offline training data from the same problems: the right answer (tagged) vs a wrong one.

    ``kind``: ``"paired"`` (DPO/ORPO/CPO: ``prompt``, ``chosen``, ``rejected``), ``"unpaired"`` (KTO: ``prompt``,
    ``completion``, ``label``; alternating desirable/undesirable), ``"sft"`` (``prompt``, ``completion``: the right
    answer only). Completions are assistant messages ``"a + b = s. <answer>s</answer>"``; the wrong sum is off
    by 1..5 (a near miss the model must learn to avoid), or is the right sum without the tag.
    """
    from datasets import Dataset

    if kind not in ("paired", "unpaired", "sft"):
        raise ValueError(f"kind must be 'paired', 'unpaired' or 'sft', got {kind!r}")
    problems = make_arithmetic_dataset(n, seed=seed, max_operand=max_operand)
    rng = random.Random(seed + 17)
    rows = []
    for i, row in enumerate(problems):
        question = row["prompt"][-1]["content"]
        a, b = (int(x) for x in _NUMBER.findall(question)[:2])
        right = f"{a} + {b} = {a + b}. <{ANSWER_TAG}>{a + b}</{ANSWER_TAG}>"
        wrong_sum = a + b + rng.choice([-5, -4, -3, -2, -1, 1, 2, 3, 4, 5])
        wrong = (
            f"{a} + {b} = {wrong_sum}. <{ANSWER_TAG}>{wrong_sum}</{ANSWER_TAG}>"
            if rng.random() < 0.75
            else f"{a} + {b} = {a + b}."
        )
        chosen = [{"role": "assistant", "content": right}]
        rejected = [{"role": "assistant", "content": wrong}]
        if kind == "paired":
            rows.append({"prompt": row["prompt"], "chosen": chosen, "rejected": rejected})
        elif kind == "unpaired":
            good = i % 2 == 0
            rows.append({"prompt": row["prompt"], "completion": chosen if good else rejected, "label": good})
        else:
            rows.append({"prompt": row["prompt"], "completion": chosen})
    return Dataset.from_list(rows)
