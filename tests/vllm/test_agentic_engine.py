"""TRL's tool loop served by the fast_inference engine (real SmolLM2-135M, vLLM's CPU build): every turn of the
loop generates through the engine, the adapter is synced once per optimizer step (not per turn), and the multi-turn
rows (tool results inside the completion) take the shared-prefix layout.

The model is not trained to call tools, so its turns are held to a calculator call by vLLM's own structured
outputs (``vllm_structured_outputs_regex``, applied by the engine like any sampling setting): each turn is a real
sample from the engine within that grammar; TRL parses the call, runs the tool, appends its result and asks the
engine for the next turn (``max_tool_calling_iterations=1``: one tool round, so two turns per completion)."""

from __future__ import annotations

import pytest
import torch

from slimrl.generation import vllm_status
from slimrl.patching.every_trainer.state import trainer_state

pytestmark = pytest.mark.skipif(vllm_status() is not None, reason=f"vLLM not usable here: {vllm_status()}")

STEPS = 2
CALL = (
    r'<tool_call>\n\{"name": "calculator", "arguments": '
    r'\{"expression": "[1-9][0-9]?[*+][1-9][0-9]?"\}\}\n</tool_call>'
)


def calculator(expression: str) -> str:
    """Evaluate a product or a sum of two numbers.

    Args:
        expression: e.g. "12*7"
    """
    a, op, b = expression.partition("*") if "*" in expression else expression.partition("+")
    return str(int(a) * int(b) if op == "*" else int(a) + int(b))


def test_every_turn_of_the_tool_loop_is_served_by_the_engine(tmp_path):
    from datasets import Dataset
    from trl.chat_template_utils import qwen3_chat_template

    from slimrl import FastLanguageModel, PatchFastRL, unpatch

    PatchFastRL("grpo", FastLanguageModel)
    try:
        from trl import GRPOConfig, GRPOTrainer

        model, tok = FastLanguageModel.from_pretrained(
            "SmolLM2-135M-Instruct",
            max_seq_length=1024,
            dtype=torch.float32,
            fast_inference=True,
            max_lora_rank=8,
            gpu_memory_utilization="auto",
        )
        model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, use_gradient_checkpointing=False)
        tok.chat_template = qwen3_chat_template  # SmolLM2's own template has no tools (the same ChatML markers)
        cfg = GRPOConfig(
            output_dir=str(tmp_path),
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=96,
            max_steps=STEPS,
            learning_rate=1e-4,
            beta=0.0,
            temperature=1.0,
            report_to="none",
            use_cpu=True,
            bf16=False,
            save_strategy="no",
            logging_steps=1,
            seed=3,
            vllm_structured_outputs_regex=CALL,
            max_tool_calling_iterations=1,
        )
        prompt = [{"role": "user", "content": "What is 12 times 7? Use the calculator."}]
        trainer = GRPOTrainer(
            model=model,
            args=cfg,
            processing_class=tok,
            tools=[calculator],
            train_dataset=Dataset.from_list([{"prompt": prompt}] * 8),
            reward_funcs=[lambda completions, **kw: [float(len(str(c)) % 5) for c in completions]],
        )
        engine = model.vllm_engine
        calls = []
        generate = engine.generate_ids

        def counted(prompt_token_ids, *args, **kwargs):
            calls.append(
                (
                    trainer.state.global_step,
                    len(prompt_token_ids),
                    any("<tool_response>" in tok.decode(p) for p in prompt_token_ids),
                )
            )
            return generate(prompt_token_ids, *args, **kwargs)

        engine.generate_ids = counted
        trainer.train()
    finally:
        unpatch()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == STEPS
    assert all(h["tools/call_frequency"] == 1.0 and h["tools/failure_frequency"] == 0.0 for h in logs), logs
    for step in range(STEPS):  # per step: the first turn (4 prompts), then the turn after the tool results
        turns = [(rows, after_tool) for s, rows, after_tool in calls if s == step]
        assert turns == [(4, False), (4, True)], calls
    assert engine.timings["syncs"] == STEPS  # once per optimizer step, not once per turn
    assert trainer_state(trainer).shared_prefix_forwards > 0, "the multi-turn rows did not take the layout"
