"""Vision-language models through the patched trainers: TRL alone vs ``PatchFastRL`` on the same run.

Tiny random models of three families TRL's image plumbing treats differently (:mod:`slimrl.verify.tiny_vision`:
Qwen2.5-VL with ``image_grid_thw`` patch rows, Gemma 3 with ``token_type_ids``, Idefics3/SmolVLM with
``pixel_attention_mask``), images drawn in the test. GRPO and RLOO: two steps with generation, old log-probs
(``num_iterations=2``) and a KL reference (beta > 0), single- and multi-image prompts; DPO: image preference pairs.
Each asserts slimrl's log-prob path served the calls (TRL's fused head with slimrl's kernel: the vision inputs
reach the model exactly as TRL passes them), the same completions were sampled and the LoRA updates (plain SGD:
the update is the gradient) agree.

Tolerance: 1e-4 relative on the updates and losses, the repository's parity tolerance (fp32; the kernels sum the
vocabulary in other groupings, tests/patching/parity.py).
"""

from __future__ import annotations

import pytest
import torch

from slimrl.compat.trl_info import has_fused_head
from slimrl.verify.tiny_vision import build, images
from tests.patching.parity import assert_parity, assert_patched_equals_unpatched

pytestmark = pytest.mark.skipif(
    not has_fused_head(), reason="TRL < 1.15: vision rows take TRL's own full-logit path (no slimrl route serves them)"
)

LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
ONLINE = dict(
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=6,
    max_steps=2,
    num_iterations=2,
    learning_rate=0.5,
    optim="sgd",
    lr_scheduler_type="constant",
    beta=0.04,
    temperature=0.9,
    report_to="none",
    use_cpu=True,
    bf16=False,
    save_strategy="no",
    logging_steps=1,
    seed=7,
    gradient_checkpointing=False,
)


def _prompt_rows(tv, per_prompt: int, n: int = 4) -> list[dict]:
    pics = images(n * per_prompt, tv.image_size, seed=1)
    rows = []
    for i in range(n):
        own = pics[i * per_prompt : (i + 1) * per_prompt]
        rows.append(
            {
                "prompt": [{"role": "user", "content": "How many dots?"}],
                **({"image": own[0]} if per_prompt == 1 else {"images": own}),
            }
        )
    return rows


def run_online(out, family: str, algorithm: str, per_prompt: int = 1):
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model

    tv = build(family)
    torch.manual_seed(1)
    model = get_peft_model(tv.model, LoraConfig(**LORA))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    seen: list[list[str]] = []

    def reward_chars(completions, **kwargs):
        texts = [c[0]["content"] for c in completions]
        seen.append(texts)
        return [float(sum(map(ord, t)) % 7) for t in texts]

    if algorithm == "grpo":
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Trainer
    else:
        from trl import RLOOConfig as Config
        from trl import RLOOTrainer as Trainer
    trainer = Trainer(
        model=model,
        args=Config(output_dir=str(out), **ONLINE),
        reward_funcs=[reward_chars],
        train_dataset=Dataset.from_list(_prompt_rows(tv, per_prompt)),
        processing_class=tv.processor,
    )
    trainer.train()
    deltas = {n: p.detach() - before[n] for n, p in model.named_parameters() if p.requires_grad}
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return seen, deltas, losses, trainer


@pytest.mark.parametrize("family", ["qwen2.5-vl", "gemma3", "idefics3"])
def test_grpo_with_images_equals_trl(tmp_path, family):
    assert_patched_equals_unpatched(lambda out: run_online(out, family, "grpo"), "grpo", tmp_path)


def test_grpo_with_several_images_per_prompt_equals_trl(tmp_path):
    assert_patched_equals_unpatched(lambda out: run_online(out, "qwen2.5-vl", "grpo", per_prompt=2), "grpo", tmp_path)


@pytest.mark.parametrize("family", ["qwen2.5-vl", "gemma3"])
def test_rloo_with_images_equals_trl(tmp_path, family):
    assert_patched_equals_unpatched(lambda out: run_online(out, family, "rloo"), "rloo", tmp_path)


@pytest.mark.parametrize("family", ["qwen2.5-vl", "gemma3", "idefics3"])
def test_dpo_with_image_pairs_equals_trl(tmp_path, family):
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from trl import DPOConfig, DPOTrainer

    tv = build(family)
    torch.manual_seed(1)
    model = get_peft_model(tv.model, LoraConfig(**LORA))
    pics = images(4, tv.image_size, seed=2)
    rows = [
        {
            "images": [im],
            "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many dots?"}]}],
            "chosen": [{"role": "assistant", "content": str(im.info["dots"])}],
            "rejected": [{"role": "assistant", "content": str(5 - im.info["dots"])}],
        }
        for im in pics
    ]
    args = DPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        gradient_checkpointing=False,
        seed=3,
    )
    trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tv.processor)
    assert_parity(trainer, "dpo")
