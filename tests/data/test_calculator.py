"""The calculator task's parts (``slimrl/data/calculator.py``): the tool, the tool chat template (TRL's parser reads
its calls; prefix-preserving; SFT's assistant mask covers the assistant turns only), the rewards, the problems and
the demonstrations; and the held-out eval's tool loop (``slimrl/cli/evaluate.py``) on a scripted model."""

from __future__ import annotations

import json

import pytest
import torch

from slimrl.data.calculator import (
    SYSTEM,
    TOOL_CHAT_TEMPLATE,
    answer_reward,
    calculator,
    make_calculator_dataset,
    make_tool_demonstrations,
    tool_call_reward,
    use_tool_template,
)
from slimrl.verify.tiny import CHAT_SPECIAL, chatml_char_tokenizer

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tool_tokenizer():
    """A ChatML tokenizer whose own template has no tools (as SmolLM2's), given slimrl's tool template."""
    tok = chatml_char_tokenizer(CHAT_SPECIAL)
    tok.chat_template = CHATML
    assert use_tool_template(tok) is not None
    return tok


@pytest.mark.parametrize(
    "expression,value", [("62*59", "3658"), ("7/2", "3.5"), ("(3+4)*-2", "-14"), ("10//3 + 10%3", "4"), ("1.5*2", "3")]
)
def test_calculator_evaluates_arithmetic(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize("expression", ["__import__('os')", "2**999999", "x*3", "[1]*3", "open('f')", "", "1" * 300])
def test_calculator_refuses_everything_else(expression):
    with pytest.raises(ValueError):
        calculator(expression)


def test_division_by_zero_is_the_tools_error():
    with pytest.raises(ZeroDivisionError):
        calculator("1/0")


def test_template_round_trips_a_call_through_trls_parser():
    from trl.chat_template_utils import parse_response

    tok = tool_tokenizer()
    assert tok.chat_template == TOOL_CHAT_TEMPLATE
    prompt = make_calculator_dataset(1)[0]["prompt"]
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*7"}}}
    before = tok.apply_chat_template(prompt, tools=[calculator], add_generation_prompt=True, tokenize=False)
    full = tok.apply_chat_template(
        [*prompt, {"role": "assistant", "content": "", "tool_calls": [call]}], tools=[calculator], tokenize=False
    )
    assert full.startswith(before) and SYSTEM in before and "- calculator(expression): Evaluate" in before
    ids = tok(full[len(before) :], add_special_tokens=False)["input_ids"]
    parsed = parse_response(tok, ids, prefix=tok(before, add_special_tokens=False)["input_ids"], tools=[calculator])
    assert parsed["tool_calls"] == [call]


def test_template_is_prefix_preserving_and_masks_only_assistant_turns():
    from trl.chat_template_utils import is_chat_template_prefix_preserving

    tok = tool_tokenizer()
    assert is_chat_template_prefix_preserving(tok)
    row = make_tool_demonstrations(1)[0]
    out = tok.apply_chat_template(
        row["messages"],
        tools=json.loads(row["tools"]),
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    trained = tok.decode([t for t, m in zip(out["input_ids"], out["assistant_masks"]) if m])
    expression = row["messages"][2]["tool_calls"][0]["function"]["arguments"]["expression"]
    answer = row["messages"][4]["content"]
    assert trained == (
        f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n'
        f"</tool_call><|im_end|>{answer}<|im_end|>"
    )
    a, b = map(int, expression.split("*"))
    assert row["messages"][3]["content"] == str(a * b) and answer == f"<answer>{a * b}</answer>"


def test_tool_capable_templates_are_left_and_others_refused():
    tok = tool_tokenizer()
    assert use_tool_template(tok) is None and tok.chat_template == TOOL_CHAT_TEMPLATE
    other = chatml_char_tokenizer(CHAT_SPECIAL)
    other.chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    with pytest.raises(ValueError, match="not ChatML"):
        use_tool_template(other)


def test_problems_are_seeded_and_the_splits_differ():
    a, b = make_calculator_dataset(16, seed=5), make_calculator_dataset(16, seed=5)
    assert a.to_list() == b.to_list()
    held = make_calculator_dataset(16, seed=6)
    assert {r["prompt"][-1]["content"] for r in a} != {r["prompt"][-1]["content"] for r in held}
    for row in a:
        x, y = (int(t) for t in row["prompt"][-1]["content"].rstrip("?.").replace("*", " ").split() if t.isdigit())
        assert row["answer"] == str(x * y) and 11 <= x <= 99 and 11 <= y <= 99


CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "6*7"}}}],
}


@pytest.mark.parametrize(
    "completion,answer,tool",
    [
        (
            [
                CALL,
                {"role": "tool", "name": "calculator", "content": "42"},
                {"role": "assistant", "content": "<answer>42</answer>"},
            ],
            1.0,
            0.5,
        ),
        (
            [
                CALL,
                {"role": "tool", "name": "calculator", "content": "42"},
                {"role": "assistant", "content": "It is 41."},
            ],
            0.0,
            0.5,
        ),
        (
            [
                {
                    **CALL,
                    "tool_calls": [
                        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "457"}}}
                    ],
                },
                {"role": "tool", "name": "calculator", "content": "457"},
                {"role": "assistant", "content": "<answer>457</answer>"},
            ],
            0.0,
            0.25,
        ),  # a call on made-up numbers
        (
            [
                CALL,
                {"role": "tool", "name": "calculator", "content": str({"error": "bad"})},
                {"role": "assistant", "content": "<answer>42</answer>"},
            ],
            1.0,
            0.0,
        ),
        ([{"role": "assistant", "content": "<answer>42</answer>"}], 1.0, 0.0),  # right, but no call
        (
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"type": "function", "function": {"name": "calculator", "arguments": {"expr": "6*7"}}}
                    ],
                },
                {"role": "tool", "name": "calculator", "content": "42"},
            ],
            0.0,
            0.0,
        ),  # wrong argument name
    ],
)
def test_rewards(completion, answer, tool):
    assert answer_reward([completion], answer=["42"]) == [answer]
    assert tool_call_reward([completion], answer=["42"]) == [tool]


class Scripted(torch.nn.Module):
    """A model whose greedy turns are scripted texts: the first turn a call (or plain text), then an answer."""

    def __init__(self, tok, turns: list[list[str]]):
        super().__init__()
        self.tok, self.turns, self.calls = tok, turns, []
        self.generation_config = type("G", (), {"eos_token_id": tok.eos_token_id})()
        self.device = torch.device("cpu")

    def generate(self, input_ids, attention_mask, max_new_tokens, **kwargs):
        texts = self.turns[len(self.calls)]
        self.calls.append(self.tok.batch_decode(input_ids, skip_special_tokens=False))
        new = [self.tok(t, add_special_tokens=False)["input_ids"][:max_new_tokens] for t in texts]
        width = max(map(len, new))
        new = [ids + [self.tok.pad_token_id] * (width - len(ids)) for ids in new]
        return torch.cat([input_ids, torch.tensor(new)], dim=1)


def test_eval_tool_loop_runs_the_calls_as_trls_loop_does(monkeypatch):
    from slimrl.cli import evaluate

    monkeypatch.setattr("slimrl.models.modes.for_inference", lambda m: None)
    monkeypatch.setattr("slimrl.models.modes.for_training", lambda m: None)
    tok = tool_tokenizer()
    tok.padding_side = "left"
    ds = make_calculator_dataset(3, seed=1)
    a0, b0 = ds[0]["answer"], ds[1]["answer"]
    first = [
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "' + _expr(ds[0]) + '"}}\n'
        "</tool_call><|im_end|>",
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1/0"}}\n</tool_call><|im_end|>',
        "<answer>5</answer><|im_end|>",
    ]
    second = [f"<answer>{a0}</answer><|im_end|>", f"<answer>{b0}</answer><|im_end|>"]
    model = Scripted(tok, [first, second])
    scores = evaluate.held_out_eval(
        model, tok, ds, [answer_reward, tool_call_reward], max_new_tokens=200, tools=[calculator]
    )
    assert len(model.calls) == 2 and len(model.calls[1]) == 2  # the third row made no call: no second turn
    after_tool = model.calls[1]
    assert f"<tool_response>\n{a0}\n</tool_response>" in after_tool[0]
    assert "<tool_response>\n{'error': 'division by zero'}\n</tool_response>" in after_tool[1]
    assert scores["answer_reward"] == pytest.approx(2 / 3)  # rows 0 and 1 answer right, row 2 does not
    assert scores["tool_call_reward"] == pytest.approx(0.5 / 3)  # only row 0's call ran (on its problem)


def _expr(row) -> str:
    x, y = (t for t in row["prompt"][-1]["content"].rstrip("?.").replace("*", " ").split() if t.isdigit())
    return f"{x}*{y}"
