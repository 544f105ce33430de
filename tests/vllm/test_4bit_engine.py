"""A 4-bit (QLoRA) model with ``fast_inference``: the engine generates from the NF4 weights the trainer scores, and
holds no copy of them (vLLM's CPU build, bitsandbytes' CPU back end; ``make test-vllm``).

vLLM has no bitsandbytes method of its own: slimrl's loader (slimrl/generation/shared_loader.py) runs the training
model's own ``Linear4bit`` modules inside the engine's layers. Before it, the engine loaded a 16-bit copy and sampled
from other numbers than the loss scored; TRL's importance-sampling correction then reweighted (or masked) sequences.

Tolerances: the importance ratio within 1 +- 0.02 (the issue's bar; both sides compute the same NF4 matmuls in fp32,
the engine's attention and the trainer's sum in other orders: ~1e-5 per log-prob, measured); nothing masked.
"""

from __future__ import annotations

import pytest
import torch

from slimrl.generation import vllm_status

pytestmark = [
    pytest.mark.skipif(vllm_status() is not None, reason=f"vLLM not usable here: {vllm_status()}"),
    pytest.mark.skipif(pytest.importorskip("bitsandbytes") is None, reason="needs bitsandbytes"),
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from slimrl import FastLanguageModel, PatchFastRL, unpatch
    from slimrl.data import correctness_reward, format_reward, make_arithmetic_dataset

    PatchFastRL("grpo", FastLanguageModel)
    try:
        from trl import GRPOConfig, GRPOTrainer

        model, tok = FastLanguageModel.from_pretrained(
            "SmolLM2-135M-Instruct",
            max_seq_length=256,
            dtype=torch.float32,
            load_in_4bit=True,
            fast_inference=True,
            max_lora_rank=16,
            gpu_memory_utilization="auto",
        )
        model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=32, use_gradient_checkpointing=False)
        cfg = GRPOConfig(
            output_dir=str(tmp_path_factory.mktemp("grpo4")),
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=24,
            max_steps=2,
            learning_rate=5e-4,
            beta=0.0,
            temperature=0.8,
            seed=3407,
            report_to="none",
            use_cpu=True,
            bf16=False,
            save_strategy="no",
            logging_steps=1,
        )
        trainer = GRPOTrainer(
            model=model,
            args=cfg,
            train_dataset=make_arithmetic_dataset(64),
            processing_class=tok,
            reward_funcs=[correctness_reward, format_reward],
        )
        trainer.train()
        yield trainer, model
    finally:
        unpatch()


def test_the_engine_samples_from_the_4bit_weights_the_loss_scores(run):
    trainer, _ = run
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    for row in logs:
        assert abs(row["sampling/importance_sampling_ratio/mean"] - 1) <= 0.02, row
        masked = [v for k, v in row.items() if k.startswith("sampling/is_masked")]
        assert all(v == 0 for v in masked), row


def test_the_4bit_weights_exist_once(run):
    """The engine's linear layers are the training model's 4-bit modules: their packed weights are the same
    memory, and vLLM allocated no 16-bit copy of them."""
    from slimrl.generation.engine import _engine_model
    from slimrl.generation.shared_loader import is_4bit

    _, model = run
    engine = model.vllm_engine
    vllm_model = engine.llm.collective_rpc(_engine_model)[0]
    from bitsandbytes.nn import Linear4bit

    four_bit = {id(m) for m in model.modules() if isinstance(m, Linear4bit) and is_4bit(m.weight)}
    run_by_engine = {
        id(m) for layer in vllm_model.modules() for m in getattr(getattr(layer, "quant_method", None), "modules", [])
    }
    assert four_bit and four_bit == run_by_engine
    assert engine.shared_bytes > 0
    sixteen = sum(
        p.numel()
        for n, p in vllm_model.named_parameters()
        if p.dtype == torch.float32 and ".layers." in n and p.dim() == 2
    )
    assert sixteen == 0, "vLLM holds a 16-bit copy of a decoder linear layer"
