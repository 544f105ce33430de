"""Bytes and seconds per weight sync to a vLLM server (``vllm_mode="server"``): slimrl's adapter-only sync vs TRL's
merge-and-push, on the real SmolLM2-135M + LoRA, with vLLM's CPU server started on 127.0.0.1.

    .venv-vllm/bin/python bench/server_sync.py --rank 16 --syncs 5

* ``slimrl``: ``sync_weights()`` of TRL's ``VLLMGeneration`` with slimrl's mix-in (:mod:`slimrl.generation.server`):
  the adapter saved and loaded by the server under a new name, end to end (HTTP included), the adapter changed before
  every sync; bytes = the adapter files the server reads.
* ``trl``: TRL's own ``VLLMGeneration._iter_named_params`` (merge the adapter, yield every base weight under vLLM's
  name, unmerge): what TRL streams to the server each step, and the trainer-side seconds of it. The NCCL transfer
  itself cannot run on a CPU (TRL's ``init_communicator`` needs CUDA), so its seconds here exclude the wire.
* projection for a 7B model (computed from its shapes, no download): Qwen2.5-7B in bf16 vs its LoRA adapter.
"""

from __future__ import annotations

import argparse
import statistics
import time

# Qwen2.5-7B (config.json): hidden, intermediate, layers, attention heads, KV heads, vocab; untied head.
QWEN25_7B = dict(hidden=3584, intermediate=18944, layers=28, heads=28, kv_heads=4, vocab=152064)


def projection_7b(rank: int) -> dict:
    """Bytes per sync for Qwen2.5-7B: every weight in bf16 (TRL) vs LoRA r on the 7 projections (fp32, as PEFT
    saves an adapter trained on a bf16 base with fp32 LoRA weights; bf16 halves it)."""
    s = QWEN25_7B
    head_dim = s["hidden"] // s["heads"]
    q = o = s["hidden"] * s["hidden"]
    kv = s["hidden"] * s["kv_heads"] * head_dim
    mlp = 3 * s["hidden"] * s["intermediate"]
    per_layer = q + o + 2 * kv + mlp + 2 * s["hidden"]
    weights = s["layers"] * per_layer + 2 * s["vocab"] * s["hidden"] + s["hidden"]
    lora_per_layer = rank * (
        2 * s["hidden"]
        + 2 * s["hidden"]  # q, o: in + out
        + 2 * (s["hidden"] + s["kv_heads"] * head_dim)  # k, v
        + 3 * (s["hidden"] + s["intermediate"])
    )  # gate, up, down
    return {"weights_bytes_bf16": 2 * weights, "adapter_bytes_fp32": 4 * s["layers"] * lora_per_layer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--syncs", type=int, default=5)
    args = parser.parse_args()

    import torch
    from accelerate import Accelerator
    from trl.generation.vllm_generation import VLLMGeneration

    from slimrl import FastLanguageModel
    from slimrl.generation.local_server import local_server
    from slimrl.generation.server import server_generation_class
    from slimrl.models.loader import resolve_model_path

    model, tok = FastLanguageModel.from_pretrained("SmolLM2-135M-Instruct", max_seq_length=512, dtype=torch.float32)
    model = FastLanguageModel.get_peft_model(model, r=args.rank, lora_alpha=args.rank, use_gradient_checkpointing=False)
    lora = [p for n, p in model.named_parameters() if "lora_B" in n]
    accelerator = Accelerator(cpu=True)
    rows = {}
    with local_server(str(resolve_model_path("SmolLM2-135M-Instruct")), lora_rank=args.rank) as url:
        backend = server_generation_class(VLLMGeneration)(
            model=model, accelerator=accelerator, processing_class=tok, mode="server", server_base_url=url
        )
        seconds, sizes = [], []
        for _ in range(args.syncs):
            with torch.no_grad():
                for p in lora:
                    p.add_(torch.randn_like(p) * 1e-3)  # a new adapter each time, as after an optimizer step
            t0 = time.perf_counter()
            backend.sync_weights()
            seconds.append(time.perf_counter() - t0)
            sizes.append(backend.adapter_pusher.last_bytes)
        rows["slimrl"] = (statistics.median(sizes), statistics.median(seconds))

    trl = VLLMGeneration.__new__(VLLMGeneration)  # TRL's own iteration, without a server to push to
    trl.model, trl.accelerator = model, accelerator
    from trl.generation.vllm_generation import DistributedBackend

    trl._dist = DistributedBackend(accelerator)
    seconds, sizes = [], []
    for _ in range(args.syncs):
        t0 = time.perf_counter()
        total = sum(t.numel() * t.element_size() for _, t in trl._iter_named_params())
        seconds.append(time.perf_counter() - t0)
        sizes.append(total)
    rows["trl"] = (statistics.median(sizes), statistics.median(seconds))

    print(f"| side | bytes per sync | seconds per sync (median of {args.syncs}) |")
    print("|---|---|---|")
    print(
        f"| slimrl (adapter saved + loaded by the server, HTTP included) | {rows['slimrl'][0] / 2**20:.1f} MiB | "
        f"{rows['slimrl'][1]:.3f} s |"
    )
    print(
        f"| TRL (merge, every weight, unmerge; NCCL wire not run on CPU) | {rows['trl'][0] / 2**20:.1f} MiB | "
        f"{rows['trl'][1]:.3f} s + transfer |"
    )
    print(f"bytes ratio slimrl/TRL: {rows['slimrl'][0] / rows['trl'][0]:.4f}")
    proj = projection_7b(args.rank)
    print(
        f"computed, Qwen2.5-7B: TRL {proj['weights_bytes_bf16'] / 2**30:.2f} GiB per sync (bf16 weights) vs slimrl "
        f"{proj['adapter_bytes_fp32'] / 2**20:.0f} MiB (LoRA r={args.rank}, fp32), ratio "
        f"{proj['adapter_bytes_fp32'] / proj['weights_bytes_bf16']:.4f}"
    )


if __name__ == "__main__":
    main()
