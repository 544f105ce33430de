"""One patched GRPO step on a tiny model, run by `accelerate launch --num_processes 2` from the test (or in one
process with the same global batch: ``--single``).

Generation is replaced (in this test only) by a deterministic function of the prompt and the sample's index in
its group, so the two-process and the one-process runs train on the same completions and their updates can be
compared. Writes, per rank, the trainable weights after the step and the prompts the rank's reward saw.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def deterministic_completions(prompt_ids: list[list[int]]) -> list[list[int]]:
    """Six tokens from the prompt's ids and the sample's index among identical prompts, then EOS (id 1)."""
    seen: dict[tuple, int] = {}
    out = []
    for ids in prompt_ids:
        k = seen.get(tuple(ids), 0)
        seen[tuple(ids)] = k + 1
        out.append([3 + (sum(ids) * 7 + k * 13 + j * 5) % 40 for j in range(6)] + [1])
    return out


def lift_accelerator_only_rule() -> None:
    """accelerate 1.15 turns on FSDP and DeepSpeed only for accelerator process groups (``state.py``, and DeepSpeed
    only without ``cpu``): the process group is built as on a CPU (gloo) and then counted as an accelerator one, and
    the trainer runs with ``use_cpu=False`` (the device is still the CPU). This test only: what it checks is slimrl
    under the sharded engines, not accelerate's launcher rules."""
    import accelerate.state as st
    from accelerate.utils import DistributedType

    orig = st.PartialState.__init__

    def init(self, cpu=False, **kwargs):
        orig(self, cpu=True, **kwargs)
        if self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.MULTI_GPU

    st.PartialState.__init__ = init


def main(out: str, single: bool = False, sharded: bool = False) -> None:
    if sharded:
        lift_accelerator_only_rule()
    import torch
    from accelerate import PartialState
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file

    from slimrl import PatchFastRL
    from slimrl.patching.every_trainer.state import trainer_state

    PatchFastRL("grpo")
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.tiny import tiny_llama, tiny_tokenizer

    state = PartialState()
    model = tiny_llama(seed=0)
    torch.manual_seed(1)
    model = get_peft_model(
        model,
        LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False, task_type="CAUSAL_LM"
        ),
    )
    seen: list[str] = []

    def reward_digits(prompts, completions, **kwargs):
        seen.extend(prompts)
        return [float(sum(ch.isdigit() for ch in c)) for c in completions]

    class FixedGenerationGRPO(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            return deterministic_completions(prompt_ids), None

    args = GRPOConfig(
        output_dir=str(Path(out) / "run"),
        per_device_train_batch_size=4 if single else 2,
        num_generations=2,
        max_completion_length=8,
        max_steps=1,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        report_to="none",
        use_cpu=not sharded,
        bf16=False,
        save_strategy="no",
        gradient_checkpointing=False,
        seed=7,
        temperature=1.2,
    )
    ds = Dataset.from_list([{"prompt": p} for p in ["1+2=", "3+4=", "5+6=", "7+8="] * 2])
    trainer = FixedGenerationGRPO(
        model=model, args=args, reward_funcs=[reward_digits], train_dataset=ds, processing_class=tiny_tokenizer()
    )
    trainer.train()
    weights = {
        n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().contiguous()  # FSDP2: DTensor
        for n, p in model.named_parameters()
        if p.requires_grad
    }
    rank = "single" if single else state.process_index
    save_file(weights, str(Path(out) / f"rank{rank}.safetensors"))
    Path(out, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "world_size": state.num_processes,
                "prompts": seen,
                "engine": trainer.accelerator.distributed_type.value,
                "dtensor": any(hasattr(p, "full_tensor") for p in trainer.model_wrapped.parameters()),
                "zero3_head": hasattr(model.get_output_embeddings().weight, "ds_id"),
                "slimrl_tokens": trainer_state(trainer).trained_tokens,
                "shared_prefix_forwards": trainer_state(trainer).shared_prefix_forwards,
            }
        )
    )
    # gloo's threads stopped before the interpreter exits: left to exit, a rank under load can abort in teardown
    # ("terminate called without an active exception") after everything above was written
    state.wait_for_everyone()
    state.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], single="--single" in sys.argv[2:], sharded="--sharded" in sys.argv[2:])
