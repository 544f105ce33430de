"""One rank of tests/vllm/test_two_engines.py: its own engine beside the process group torchrun made."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from vllm import SamplingParams

    from slimrl import FastLanguageModel

    model, tok = FastLanguageModel.from_pretrained(
        "SmolLM2-135M-Instruct",
        max_seq_length=128,
        dtype=torch.float32,
        fast_inference=True,
        max_lora_rank=8,
        gpu_memory_utilization="auto",
    )
    model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, use_gradient_checkpointing=False)
    engine = model.vllm_engine
    engine.max_num_seqs = 4
    request = engine.load_adapter(model)
    outs = engine.generate_ids([[1, 2, 3, 4]] * 2, SamplingParams(max_tokens=6, temperature=1.0), lora_request=request)
    config = engine.llm.llm_engine.vllm_config
    info = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "device": str(engine.device),
        "backend": config.parallel_config.distributed_executor_backend,
        "seed": config.model_config.seed,
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "shared_bytes": engine.shared_bytes,
    }
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(info, f)


if __name__ == "__main__":
    main(sys.argv[1])
