"""The built-in agentic task (``slimrl train --task calculator``): two-number multiplications that the model answers
by calling a calculator tool through TRL's tool loop (``GRPOTrainer(tools=[calculator])``).

Each row: ``prompt`` (a system line asking for the tool and an ``<answer>N</answer>`` reply, then the question) and
``answer`` (the product as a string). A completion is TRL's message list: the assistant turn with its tool call, the
tool's result, the assistant's final turn. Two rewards: :func:`answer_reward` (the final number is right) and
:func:`tool_call_reward` (a well-formed calculator call that ran; full credit when it computed the problem).
SmolLM2-135M-Instruct makes no tool call on its own (0 in 32 samples with the tool and a worked example in the
prompt), so the task starts with a few supervised steps on demonstrations (:func:`make_tool_demonstrations`) that
put the call format within reach of sampling; GRPO then makes it the model's habit.

SmolLM2's chat template cannot show tools: :func:`use_tool_template` gives a ChatML tokenizer a compact one
(:data:`TOOL_CHAT_TEMPLATE`) that writes calls and results the way Qwen's template does, so TRL's Qwen response
parser reads the model's calls.
"""

from __future__ import annotations

import ast
import json
import operator
import random
from typing import Any

from slimrl.data.arithmetic import ANSWER_TAG, extract_answer

SYSTEM = f"Use the calculator tool for arithmetic, then give the result as <{ANSWER_TAG}>N</{ANSWER_TAG}>."
_QUESTIONS = ("What is {a} times {b}?", "What is {a} * {b}?", "Compute {a} * {b}.", "Multiply {a} by {b}.")

# ChatML with tools, short enough for a 135M model on a CPU (~70 prompt tokens with one tool): tools listed as
# `name(args): description` in the system turn; an assistant call is `<tool_call>\n{json}\n</tool_call>` and results
# come back in a user turn as `<tool_response>\n...\n</tool_response>` (Qwen's layout, so TRL's Qwen parser applies).
# Assistant turns are inside {% generation %} so TRL's SFT can train on them alone (assistant_only_loss).
TOOL_CHAT_TEMPLATE = (
    "{%- if messages[0].role == 'system' or tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- if tools %}{{- '\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- if tools %}{{- 'Tools:' }}"
    "{%- for tool in tools %}{%- set f = tool.function if tool.function is defined else tool %}"
    "{{- '\\n- ' + f.name + '(' + (f.parameters.properties | list | join(', ')) + '): ' + f.description }}"
    "{%- endfor %}"
    '{{- \'\\nCall a tool as <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>\' }}'
    "{%- endif %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{%- generation %}{{- content }}"
    "{%- for call in message.tool_calls or [] %}{%- set call = call.function if call.function is defined else call %}"
    "{%- if content or not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' }}'
    "{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of numbers with + - * / // % and parentheses.

    Args:
        expression: the expression, e.g. "12*7"
    """

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            return -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"not an arithmetic expression: {expression!r}")

    if not isinstance(expression, str) or len(expression) > 200:
        raise ValueError("expression must be a string of at most 200 characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    result = value(tree.body)  # ZeroDivisionError propagates: TRL reports it as the tool's error
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


def use_tool_template(tokenizer) -> str | None:
    """Give ``tokenizer`` a chat template that shows tools and a response parser for its calls, when its own
    template has no tools; returns a line saying what was done (None when nothing was). Raises ValueError for a
    template without tools that is not ChatML (no template here fits it)."""
    from trl.chat_template_utils import add_response_schema, qwen3_chat_template

    template = tokenizer.chat_template or ""
    if "tools" in template:
        return None
    if "<|im_start|>" not in template:
        raise ValueError(
            "the model's chat template shows no tools and is not ChatML (<|im_start|>); give the "
            "tokenizer a tool-capable chat_template"
        )
    tokenizer.chat_template = qwen3_chat_template  # TRL knows its parser by the template's text ...
    add_response_schema(tokenizer)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE  # ... and ours writes calls the same way
    return "the model's chat template shows no tools: slimrl's ChatML tool template is used (calls as <tool_call>)"


def _question(rng: random.Random, low: int, high: int) -> tuple[str, int, int]:
    a, b = rng.randint(low, high), rng.randint(low, high)
    return rng.choice(_QUESTIONS).format(a=a, b=b), a, b


def make_calculator_dataset(n: int, seed: int = 3407, low: int = 11, high: int = 99) -> Any:
    """``n`` problems ``a * b`` (``low <= a, b <= high``) as a ``datasets.Dataset`` with prompt/answer columns;
    ``prompt`` is a chat: the system line (:data:`SYSTEM`) and the question."""
    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        question, a, b = _question(rng, low, high)
        rows.append(
            {
                "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                "answer": str(a * b),
            }
        )
    return Dataset.from_list(rows)


def make_tool_demonstrations(n: int, seed: int = 3407) -> Any:
    """``n`` worked conversations for TRL's SFT (``messages`` and ``tools`` columns): the question, the assistant's
    calculator call, the tool's result, the tagged answer. Drawn from their own seed, apart from the problems."""
    from datasets import Dataset
    from transformers.utils import get_json_schema

    rng = random.Random(seed + 7919)
    tools = json.dumps([get_json_schema(calculator)])
    rows = []
    for _ in range(n):
        question, a, b = _question(rng, 11, 99)
        expression = f"{a}*{b}"
        call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "name": "calculator", "content": calculator(expression)},
                    {"role": "assistant", "content": f"<{ANSWER_TAG}>{a * b}</{ANSWER_TAG}>"},
                ],
                "tools": tools,
            }
        )
    return Dataset.from_list(rows)


def _final_text(completion: Any) -> str:
    """The last assistant turn's text of a completion (a message list, or plain text)."""
    if isinstance(completion, str):
        return completion
    turns = [m for m in completion if m.get("role") == "assistant"]
    return (turns[-1].get("content") or "") if turns else ""


def answer_reward(completions: list, answer: list[str], **kwargs: Any) -> list[float]:
    """1.0 when the final assistant turn's number (tagged, else last) equals the answer, else 0.0."""
    return [1.0 if extract_answer(_final_text(c)) == a else 0.0 for c, a in zip(completions, answer)]


def tool_call_reward(completions: list, answer: list[str], **kwargs: Any) -> list[float]:
    """0.5 when a ``calculator`` call ran and returned the problem's answer (a call on the question), 0.25 when
    calls ran but none returned it (well-formed, but on something else), 0.0 without a call that ran (TRL writes a
    failed call's result as ``{'error': ...}``). The two tiers keep a call on made-up numbers from paying as much as
    a useful one (with one flat reward for any call that ran, GRPO learned to call on anything and stop answering)."""
    out = []
    for c, a in zip(completions, answer):
        score = 0.0
        if not isinstance(c, str):
            calls = [
                call.get("function", call)
                for m in c
                if m.get("role") == "assistant"
                for call in m.get("tool_calls") or []
            ]
            results = [str(m.get("content", "")) for m in c if m.get("role") == "tool"]
            well_formed = any(
                call.get("name") == "calculator" and "expression" in (call.get("arguments") or {}) for call in calls
            )
            if well_formed and results and not any(r.startswith("{'error'") for r in results):
                score = 0.5 if a in results else 0.25
        out.append(score)
    return out
